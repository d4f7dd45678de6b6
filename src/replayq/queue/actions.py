"""Operator actions on one job: cancel it, or requeue it from dead; each one traced.

``queue/bulk.py`` applies the same changes to every job a filter selects.
"""

from __future__ import annotations

from replayq.errors import ConfigurationError
from replayq.queue import lifecycle
from replayq.runtime import Runtime
from replayq.storage.protocol import JobCancel, JobCancelRequest, JobRequeue

__all__ = ["cancel_job", "requeue_job"]


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
