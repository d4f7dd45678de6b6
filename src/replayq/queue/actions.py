"""Operator actions on one job: cancel it, release it, or requeue it from dead; each traced.

``queue/bulk.py`` applies the same changes to every job a filter selects.
"""

from __future__ import annotations

from replayq.errors import ConfigurationError
from replayq.model import Job
from replayq.queue import lifecycle
from replayq.runtime import Runtime
from replayq.storage.protocol import (
    JobCancel,
    JobCancelRequest,
    JobRequeue,
    TraceQuery,
    Transaction,
)

__all__ = ["cancel_job", "release_target", "request_release", "requeue_job"]


def request_release(
    tx: Transaction, job: Job, to_version: str, *, now: float, hlc: int, reason: str
) -> bool:
    """Ask a running attempt to go back to the queue on ``to_version`` at its next step.

    The cancel path carries it (the heartbeat sees the request, the attempt stops at
    its next step boundary); ``job.release_requested`` in the trace tells the worker
    that the stop is a release, not a cancel. ``False`` if the job is not running or
    was already asked to stop.
    """
    if not tx.job_transition(JobCancelRequest(job.id, now, hlc)):
        return False
    event = lifecycle.lifecycle(
        lifecycle.JOB_RELEASE_REQUESTED,
        job,
        now=now,
        hlc=hlc,
        status="running",
        from_version=job.handler_version,
        to_version=to_version,
        reason=reason,
    )
    tx.trace_append([event])
    return True


def release_target(tx: Transaction, job: Job) -> str | None:
    """The version a release asked this attempt of ``job`` to go back to; ``None``: a cancel."""
    for event in reversed(tx.trace_query(TraceQuery(job_id=job.id))):
        if event.name == lifecycle.JOB_RELEASE_REQUESTED and event.attempt == job.attempt:
            return str(event.data["to_version"])
    return None


def cancel_job(runtime: Runtime, job_id: int) -> bool:
    """``App.cancel``: cancel a queued job, or ask a running one to stop; ``False`` if neither."""
    now, hlc = runtime.clock.now(), runtime.hlc.tick()
    with runtime.storage.transaction() as tx:
        if tx.job_transition(JobCancelRequest(job_id, now, hlc)):
            return True
        if not tx.job_transition(JobCancel(job_id, now, hlc)):
            return False
        job = tx.job_get(job_id)
        assert job is not None
        tx.trace_append(
            [
                lifecycle.lifecycle(
                    lifecycle.JOB_CANCELLED, job, now=now, hlc=hlc, status="cancelled"
                )
            ]
        )
    return True


def requeue_job(
    runtime: Runtime, job_id: int, *, reason: str, to_version: str | None = None
) -> bool:
    """``App.requeue``: a dead job back to the queue with one more attempt, the reason traced."""
    if not reason.strip():
        raise ConfigurationError("requeue needs a reason; it goes into the job's trace")
    now, hlc = runtime.clock.now(), runtime.hlc.tick()
    with runtime.storage.transaction() as tx:
        if not tx.job_transition(JobRequeue(job_id, now, hlc, to_version=to_version)):
            return False
        job = tx.job_get(job_id)
        assert job is not None
        tx.trace_append(
            [
                lifecycle.lifecycle(
                    lifecycle.JOB_REQUEUED,
                    job,
                    now=now,
                    hlc=hlc,
                    reason=reason,
                    to_version=to_version,
                )
            ]
        )
    return True
