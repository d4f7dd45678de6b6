"""The parameters of the retention verbs: ``keep_transition``, ``gc_scan``, ``gc_apply``.

Imports: the foundations only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from replayq.model import TraceEvent


@dataclass(frozen=True, slots=True)
class KeepPin:
    """Pin a job: gc never collects it (``replayq keep JOB --reason``)."""

    job_id: int
    reason: str
    now: float


@dataclass(frozen=True, slots=True)
class KeepHold:
    """A live fork, dry-run or verification holds the job it runs from until it releases
    the hold or ``expires_at``: gc neither trims nor deletes the job, nor collects its
    derived traces, meanwhile. Applies (``True``) only if the job exists."""

    holder: str
    job_id: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class KeepRelease:
    holder: str


KeepChange = KeepPin | KeepHold | KeepRelease
"""Every write of a pin or a hold: ``keep_transition`` returns whether it applied."""


@dataclass(frozen=True, slots=True)
class KeptJobs:
    """The pinned jobs (``KeepRecord``), by id."""


@dataclass(frozen=True, slots=True)
class GcScan:
    """Finished jobs past ``cutoff`` with an id above ``after``, at most ``limit``
    (``GcCandidate``): never a pinned one, nor one held at ``now``, nor one a derived
    trace came from on or after ``cutoff``."""

    after: int
    cutoff: float
    limit: int
    now: float


@dataclass(frozen=True, slots=True)
class GcCursor:
    """The last job id the gc pass ``name`` finished with (0: from the start)."""

    name: str


@dataclass(frozen=True, slots=True)
class JobHours:
    """The aggregates of the jobs gc deleted (``JobHour``), oldest hour first."""

    job_type: str | None = None


@dataclass(frozen=True, slots=True)
class DerivedScan:
    """Derived traces (replays, forks, verifications) created before ``cutoff``, after the
    ``(created_at, trace_id)`` cursor, at most ``limit`` (``DerivedCandidate``): never one
    whose source job is pinned or held at ``now``."""

    after: tuple[float, str]
    cutoff: float
    limit: int
    now: float


@dataclass(frozen=True, slots=True)
class BlobScan:
    """Blobs nobody stored since ``before`` that no trace event, state version, step or
    idempotency record references, by hash above ``after``, at most ``limit``
    (``BlobCandidate``)."""

    after: str
    before: float
    limit: int


GcQuery = KeptJobs | GcScan | GcCursor | JobHours | DerivedScan | BlobScan
"""Every question gc asks: ``gc_scan`` answers each with its records (a cursor: an int)."""


@dataclass(frozen=True, slots=True)
class TraceTrim:
    """Rewrite a job's trace packs with what ``keep`` returns of its events (a subset, an
    event possibly with other data; a pack left empty is deleted, with its resource index
    entries); nothing if the job is held at ``now``."""

    job_id: int
    keep: Callable[[list[TraceEvent]], list[TraceEvent]]
    now: float


@dataclass(frozen=True, slots=True)
class JobPurge:
    """Count a job into its hour (``JobHours``), then delete it: its row, its trace packs
    and their index entries, its steps; nothing if the job is held at ``now``."""

    job_id: int
    now: float


@dataclass(frozen=True, slots=True)
class IdemPurge:
    """Forget a job's settled idempotency records (an in-flight claim stays)."""

    job_id: int


@dataclass(frozen=True, slots=True)
class MessageIdForget:
    """Forget a finished job's message id: the same message id makes a new job again."""

    job_id: int


@dataclass(frozen=True, slots=True)
class DerivedPurge:
    """Delete a derived trace: its packs and their index entries, its branch's state
    versions, the branch and the lineage row; nothing if its source job is held at ``now``."""

    trace_id: str
    now: float


@dataclass(frozen=True, slots=True)
class BlobPurge:
    """Delete these blobs, each only if nobody stored it since ``before``."""

    hashes: Sequence[str]
    before: float


@dataclass(frozen=True, slots=True)
class GcCursorPut:
    name: str
    cursor: int
    now: float


@dataclass(frozen=True, slots=True)
class GcVacuum:
    """Give freed pages back (SQLite incremental vacuum; nothing on PostgreSQL)."""


GcChange = (
    TraceTrim
    | JobPurge
    | IdemPurge
    | MessageIdForget
    | DerivedPurge
    | BlobPurge
    | GcCursorPut
    | GcVacuum
)
"""Every change gc makes: ``gc_apply`` returns how many events, jobs or rows it removed."""
