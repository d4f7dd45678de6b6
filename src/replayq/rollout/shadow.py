"""Shadow and dual-run comparisons: a settled attempt re-run on the candidate, sealed.

The candidate runs with every outside answer the authoritative attempt recorded
(its calls, reads and effects), inside the seal, so it makes no real effect and
reaches nothing; its differences are classed as ``rollout verify`` classes them
and stored in ``rq_rollout_comparisons`` for ``rollout status``.

Every worker imports this module; the replay engine loads at the first comparison
(``rollout.verify`` says why).
"""

from __future__ import annotations

from replayq import codec
from replayq.model import Job
from replayq.rollout.verify import classify
from replayq.runtime import Runtime
from replayq.storage.protocol import ComparisonPut, TraceQuery


def compare_attempt(runtime: Runtime, job: Job, version: str, *, mode: str) -> list[str]:
    """Run ``version`` over ``job``'s attempt (as recorded) and store the comparison."""
    from replayq.replay.engine import dry_run

    report = dry_run(runtime, job.id, attempt=job.attempt, version=version)
    with runtime.storage.transaction(readonly=True) as tx:
        recorded = [
            e
            for e in tx.trace_query(TraceQuery(job_id=job.id))
            if e.attempt == job.attempt and e.kind == "domain"
        ]
        now = tx.trace_query(TraceQuery(trace_id=report.trace_id))
    classes, details = classify(report, recorded, now)
    with runtime.storage.transaction() as tx:
        tx.rollout_update(
            ComparisonPut(
                job_type=job.job_type,
                job_id=job.id,
                attempt=job.attempt,
                mode=mode,
                from_version=job.handler_version,
                to_version=version,
                classes=codec.dumps(classes),
                report=codec.dumps({"details": details, "trace_id": report.trace_id}),
                now=runtime.clock.now(),
            )
        )
    return classes
