"""A resource's timeline: every event touching one resource, across jobs and workers.

``App.resource_trace`` and ``replayq trace resource`` read it: who held the lock,
who read which version, who wrote first, with the lease transitions of the jobs
that touched it merged in on request.
"""

from __future__ import annotations

from replayq.model import TraceEvent
from replayq.queue import lifecycle
from replayq.runtime import Runtime
from replayq.storage.context_params import LineageQuery
from replayq.storage.protocol import TraceQuery

__all__ = ["RESOURCE_LIFECYCLE", "resource_trace"]

# The lifecycle events a resource timeline shows for the jobs that touched the resource.
RESOURCE_LIFECYCLE = frozenset(
    {
        lifecycle.JOB_LEASED,
        lifecycle.LEASE_EXPIRED,
        lifecycle.LEASE_LOST,
        lifecycle.JOB_REDELIVERED,
        lifecycle.RETRY_SCHEDULED,
        lifecycle.JOB_SUCCEEDED,
        lifecycle.JOB_FAILED,
        lifecycle.JOB_DEAD,
        lifecycle.WRITE_REJECTED,
    }
)


def resource_trace(
    runtime: Runtime, resource: str, *, leases: bool = False, all_origins: bool = False
) -> list[TraceEvent]:
    """``App.resource_trace``: a resource's events in HLC order (see there for the options)."""
    with runtime.storage.transaction(readonly=True) as tx:
        events = [
            e
            for e in tx.trace_query(TraceQuery(resource=resource))
            if e.resource == resource or (e.resource or "")[len(resource) + 2 :].isdigit()
        ]
        if not all_origins:
            derived = {
                t for t in {e.trace_id for e in events} if tx.lineage_list(LineageQuery(trace_id=t))
            }
            events = [e for e in events if e.trace_id not in derived]
        if leases:
            for job_id in sorted({e.job_id for e in events if e.job_id is not None}):
                events.extend(
                    e
                    for e in tx.trace_query(TraceQuery(job_id=job_id))
                    if e.kind == "lifecycle" and e.name in RESOURCE_LIFECYCLE
                )
    return sorted(events, key=lambda e: (e.hlc, e.id or 0))
