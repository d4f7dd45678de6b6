"""Trace event names, and building and reading lifecycle events.

Every lifecycle transition is one ``TraceEvent`` committed in the same
transaction as the change it describes. The names are documented as a table
in ``docs/reference/trace-events.md``.
"""

from __future__ import annotations

from typing import Any

from replayq.model import Job, TraceEvent

JOB_ENQUEUED = "job.enqueued"
JOB_DEDUPLICATED = "job.deduplicated"
JOB_LEASED = "job.leased"
LEASE_EXTENDED = "lease.extended"
LEASE_LOST = "lease.lost"
LEASE_EXPIRED = "lease.expired"
LEASE_RELEASED = "lease.released"
JOB_REDELIVERED = "job.redelivered"
RETRY_SCHEDULED = "retry.scheduled"
JOB_SUCCEEDED = "job.succeeded"
JOB_FAILED = "job.failed"
JOB_DEAD = "job.dead"
JOB_CANCELLED = "job.cancelled"
JOB_REQUEUED = "job.requeued"
JOB_RELEASE_REQUESTED = "job.release_requested"
JOB_RELEASED = "job.released"
WRITE_REJECTED = "job.write_rejected"
# A job type's routing changed (replayq rollout …): not a job's event, the type's.
ROUTING_CHANGED = "routing.changed"

LIFECYCLE_EVENTS = (
    JOB_ENQUEUED,
    JOB_DEDUPLICATED,
    JOB_LEASED,
    LEASE_EXTENDED,
    LEASE_LOST,
    LEASE_EXPIRED,
    LEASE_RELEASED,
    JOB_REDELIVERED,
    RETRY_SCHEDULED,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_DEAD,
    JOB_CANCELLED,
    JOB_REQUEUED,
    JOB_RELEASE_REQUESTED,
    JOB_RELEASED,
    WRITE_REJECTED,
)


def lifecycle(
    name: str,
    job: Job,
    *,
    now: float,
    hlc: int,
    worker_id: str | None = None,
    status: str | None = None,
    attempt: int | None = None,
    **data: Any,
) -> TraceEvent:
    """A lifecycle event for ``job`` (the job's own trace, its current attempt by default)."""
    # Every field named (``TraceEvent.built``): no frozen ``__init__`` per event, which a
    # leased and an acked job pay twice and an enqueue once.
    return TraceEvent.built(
        {
            "trace_id": job.trace_id,
            "job_id": job.id,
            "attempt": job.attempt if attempt is None else attempt,
            "kind": "lifecycle",
            "name": name,
            "seq": None,
            "step": None,
            "ts": now,
            "hlc": hlc,
            "worker_id": worker_id,
            "status": status,
            "resource": None,
            "resource_version": None,
            "side_effect": False,
            "input_ref": None,
            "output_ref": None,
            "data": data,
            "id": None,
        }
    )
