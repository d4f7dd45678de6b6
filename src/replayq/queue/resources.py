"""A resource's timeline: every event touching one resource, across jobs and workers.

``App.resource_trace`` and ``replayq trace resource`` read it: who held the lock,
who read which version, who wrote first, with the lease transitions of the jobs
that touched it merged in on request.

A trace stores each resource redacted (``Redactor.resource``: ``card:4111…`` is
``card:[redacted:…]``), so the id asked for is looked up as each set of rules would
have stored it (``stored_names``): the app's, each job type's own, and as given (a
trace recorded before resources were redacted, or a marker typed as shown). Two ids
that redact alike (no key: every card number is ``card:[redacted]``) share a timeline.
"""

from __future__ import annotations

from replayq.model import TraceEvent
from replayq.queue import lifecycle
from replayq.runtime import Runtime
from replayq.storage.context_params import LineageQuery
from replayq.storage.protocol import TraceQuery

__all__ = ["RESOURCE_LIFECYCLE", "resource_trace", "stored_names"]

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
        # By the stored event (a name may be asked twice: ``order:1`` is its own redaction).
        found: dict[tuple[str, int | None, int | None, int], TraceEvent] = {}
        for name in stored_names(runtime, resource):
            for e in tx.trace_query(TraceQuery(resource=name)):
                if e.resource == name or (e.resource or "")[len(name) + 2 :].isdigit():
                    found.setdefault((e.trace_id, e.id, e.seq, e.hlc), e)
        events = list(found.values())
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


def stored_names(runtime: Runtime, resource: str) -> list[str]:
    """The texts a trace may hold for ``resource``: redacted by the app's rules, by each
    job type's own (a job type's pattern may redact what the app's do not), and as given
    (a trace recorded before resources were redacted); each once, the app's first."""
    names = [runtime.redactor.resource(resource)]
    for handler in runtime.registry.handlers():
        if handler.redactor is not None:
            names.append(handler.redactor.resource(resource))
    names.append(resource)
    return list(dict.fromkeys(names))
