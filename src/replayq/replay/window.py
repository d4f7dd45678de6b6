"""Questions across jobs by time: the events of a window, and the signals as a time series.

A window is a range of the hybrid logical clock (``[since, until)`` in wall-clock
seconds, compared with each event's HLC), so the events come back in happens-before
order across workers whatever their wall clocks said, and an event is in the window
exactly when its place in that order is. Only production traces are read (each
job's own trace: not replays, forks or reruns).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from msgspec import structs

from replayq.model import TraceEvent
from replayq.replay.signals import SIGNALS
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import TraceWindow
from replayq.storage.reports import SignalSeries

__all__ = ["BUCKETS", "SignalPoint", "WindowEvent", "events_between", "signal_series"]

BUCKETS = {"second": 1, "minute": 60, "hour": 3600}
_PAGE = 1000
_FAR_FUTURE = 1 << 62


def hlc_at(seconds: float | None, default: int) -> int:
    """The smallest HLC value stamped at or after ``seconds`` (wall clock)."""
    if seconds is None:
        return default
    return int(seconds * 1000) << 16


@dataclass(frozen=True)
class WindowEvent:
    """One event of a window, with its job's type and version."""

    event: TraceEvent
    job_type: str
    version: str | None


def events_between(
    source: RuntimeSource,
    *,
    since: float | None = None,
    until: float | None = None,
    job_type: str | None = None,
    name: str | None = None,
    resource: str | None = None,
    version: str | None = None,
) -> Iterator[WindowEvent]:
    """Stream the events of production jobs in ``[since, until)``, in HLC order.

    Read a page at a time (one short read transaction each), so a long window
    never holds a transaction open; ``resource`` is a prefix, redacted as a trace stores
    resources (by ``job_type``'s rules, else the app's): ``card:4111…`` finds the events
    of ``card:[redacted:…]``; a prefix that stops inside a secret matches nothing.
    """
    runtime = source.runtime
    if resource is not None:
        resource = runtime.redactor_for(job_type).resource(resource)
    params = TraceWindow(
        since_hlc=hlc_at(since, 0),
        until_hlc=hlc_at(until, _FAR_FUTURE),
        job_type=job_type,
        version=version,
        name=name,
        resource=resource,
        limit=_PAGE,
    )
    while True:
        with runtime.storage.transaction(readonly=True) as tx:
            page = tx.trace_query(params)
        for event, event_type, event_version in page:
            yield WindowEvent(event, event_type, event_version)
        if len(page) < params.limit:
            return
        last = page[-1][0]
        params = structs.replace(params, after_hlc=last.hlc, after_id=last.id or 0)


@dataclass(frozen=True)
class SignalPoint:
    """How many of one signal happened in one bucket, for one job type and version."""

    bucket: float  # the bucket's start, wall-clock seconds
    job_type: str
    version: str | None
    signal: str
    event: str
    count: int


def signal_series(
    source: RuntimeSource,
    *,
    by: str = "minute",
    since: float | None = None,
    until: float | None = None,
) -> list[SignalPoint]:
    """The seed-003 signals per ``by`` bucket (``second``, ``minute``, ``hour``), per job
    type and version; buckets with no signal are absent."""
    bucket_ms = BUCKETS[by] * 1000
    with source.runtime.storage.transaction(readonly=True) as tx:
        rows = tx.report(
            SignalSeries(list(SIGNALS), hlc_at(since, 0), hlc_at(until, _FAR_FUTURE), bucket_ms)
        )
    return [
        SignalPoint(
            bucket=int(row.bucket_ms) / 1000,
            job_type=row.job_type,
            version=row.version,
            signal=SIGNALS[row.name],
            event=row.name,
            count=int(row.count),
        )
        for row in rows
    ]
