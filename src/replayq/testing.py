"""Helpers for users' own test suites: run handlers inline, freeze time, replay incident cases.

* ``run_inline(app, job_type, payload)`` enqueues and runs one job in-process,
  exactly as a worker would (lease, contract lock, ack), and returns the job.
  With ``seal=True`` the handler runs sealed: I/O that bypasses ``ctx``
  (sockets, host names, subprocesses, file writes) raises ``UnrecordedIOError``
  — the guard a replay runs under — while ``ctx.call`` and ``ctx.effect`` work.
* ``FrozenClock`` (re-exported) makes lease and retry timing deterministic.
* ``replay_case(case, app)`` dry-runs a handler against a case exported with
  ``replayq trace export JOB > case.json``; ``assert_replays(case, app)`` fails
  the test with the first divergence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from replayq.app import App
from replayq.clock import FrozenClock
from replayq.model import Job
from replayq.replay.engine import ReplayReport
from replayq.replay.export import replay_case_file
from replayq.seal import seal as seal_io

__all__ = ["FrozenClock", "assert_replays", "replay_case", "run_inline"]


def run_inline(
    app: App,
    job_type: str,
    payload: Mapping[str, Any] | Any = None,
    *,
    seal: bool = False,
    **options: Any,
) -> Job:
    """Enqueue one job and run it to a settled state in this process; returns the job after.

    Jobs ahead of it in the queue (child jobs of earlier runs, say) run first, as
    they would on a worker. A retry scheduled in the future is not waited for:
    the job is returned ``queued`` (advance a ``FrozenClock`` and call again).
    """
    from replayq.model import JobState
    from replayq.worker import Worker

    job_id = app.enqueue(job_type, payload or {}, **options)
    worker = Worker(app, worker_id="inline")
    app.register_contracts()
    try:
        while app.get_job(job_id).state in (JobState.QUEUED, JobState.RUNNING):
            leased = worker.lease(1)
            if not leased:
                break
            for job in leased:
                with sealed_if(seal):
                    worker.execute(job)
    finally:
        worker.event_loop.close()
    return app.get_job(job_id)


def replay_case(
    case: dict[str, Any] | str | Path,
    app: App,
    *,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
) -> ReplayReport:
    """Dry-run ``app``'s handler for the case's job type against the recorded case (sealed)."""
    return replay_case_file(case, app, version=version, handler=handler, allow_io=allow_io)


def assert_replays(
    case: dict[str, Any] | str | Path, app: App, *, version: str | None = None
) -> ReplayReport:
    """Fail (``AssertionError`` naming the first divergence) unless the handler replays the case."""
    report = replay_case(case, app, version=version)
    if report.unrecorded_io:
        raise AssertionError(
            "the handler tried I/O that bypasses ctx: " + "; ".join(report.unrecorded_io)
        )
    if report.diverged:
        where = report.first_divergence
        detail = (
            f"at step {where.step!r}, event #{where.index}: {where.reason}"
            if where
            else f"outcome {report.outcome_recorded.status} vs {report.outcome_now.status}"
        )
        raise AssertionError(f"the handler diverges from the recorded case {detail}")
    return report


@contextmanager
def sealed_if(active: bool) -> Iterator[None]:
    """``seal()`` when ``active``; a refused call raises ``UnrecordedIOError`` in the handler."""
    if not active:
        yield
        return
    with seal_io():
        yield
