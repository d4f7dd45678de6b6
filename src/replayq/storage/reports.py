"""The questions ``Transaction.report`` answers: one frozen struct per report.

Each report is a read of many rows summed up for an operator (``replayq stats``,
``replayq metrics``, rollout gates, signals); each answers with its own record,
which the verb's overloads tell the type checker::

    JobStats()                                   -> list[StatRow]
    JobCount(JobFilter)                          -> int
    JobGauges(now)                               -> list[JobGauge]
    JobsScheduled(now, queues)                   -> tuple[int, float | None]
    JobDurations(job_type, version)              -> list[float]
    OutOfOrder()                                 -> list[OrderBreak]
    VersionOutcomes(job_type, since)             -> list[VersionOutcome]
    SignalCounts(names, since)                   -> list[tuple[str, str, int]]
    SignalSeries(names, since_hlc, until_hlc, bucket_ms) -> list[SignalBucket]
    OutboxPending()                              -> OutboxBacklog

Imports: the foundations and ``params`` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from replayq.storage.params import JobFilter


class JobStats(Struct, frozen=True):
    """Jobs counted by type and state, with the oldest ``run_at`` of each group."""


class JobCount(Struct, frozen=True):
    """How many jobs match ``filter`` (its ``limit`` and ``before`` are ignored)."""

    filter: JobFilter


class JobGauges(Struct, frozen=True):
    """Open jobs (queued, running, dead) counted by queue, type, version and state."""

    now: float


class JobsScheduled(Struct, frozen=True):
    """Queued jobs not due yet (delayed or backing off): ``(count, first run_at)``."""

    now: float
    queues: Sequence[str] | None = None


class JobDurations(Struct, frozen=True):
    """How long each finished attempt of a type (and version) ran, in seconds."""

    job_type: str
    version: str | None = None


class OutOfOrder(Struct, frozen=True):
    """Jobs run (or waiting) after an earlier job of their ordering key died or was
    cancelled, counted by ``queue``, ``job_type`` and ``version``."""


class VersionOutcomes(Struct, frozen=True):
    """Attempt ends, decisions and incidents of a type since ``since``, with the version."""

    job_type: str
    since: float


class SignalCounts(Struct, frozen=True):
    """``(job type, event name, count)`` of production jobs' events since ``since``."""

    names: Sequence[str]
    since: float


class SignalSeries(Struct, frozen=True):
    """Counts of the named events per time bucket, job type, version and name."""

    names: Sequence[str]
    since_hlc: int
    until_hlc: int
    bucket_ms: int


class OutboxPending(Struct, frozen=True):
    """Unpublished outbox rows: how many, and when the oldest was written."""


ReportQuery = (
    JobStats
    | JobCount
    | JobGauges
    | JobsScheduled
    | JobDurations
    | OutOfOrder
    | VersionOutcomes
    | SignalCounts
    | SignalSeries
    | OutboxPending
)
"""Every question ``report`` answers."""
