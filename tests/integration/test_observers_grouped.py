"""A worker with observers (metrics, OpenTelemetry) still groups its acks, and each
observer's view of an attempt ends when that attempt's ack committed, not before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import replayq

JOBS = 60


def _counting_write_transactions(storage: Any) -> list[int]:
    """Count ``storage``'s write transactions from now on (read-only ones are not commits)."""
    count = [0]
    original = storage.transaction

    @contextmanager
    def counted(*args: Any, readonly: bool = False, **kwargs: Any) -> Iterator[Any]:
        if not readonly:
            count[0] += 1
        with original(*args, readonly=readonly, **kwargs) as tx:
            yield tx

    storage.transaction = counted
    return count


def test_a_worker_with_metrics_and_spans_groups_its_acks_and_ends_each_attempt_on_its_ack(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()

    @app.job("ping")
    def ping(ctx: replayq.Context, n: int) -> int:
        return n

    app.enqueue_many([replayq.EnqueueRequest("ping", {"n": n}) for n in range(JOBS)])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = replayq.WorkerMetrics()
    tracer = replayq.AttemptTracer(provider)
    worker = replayq.Worker(app, burst=True, observers=[metrics, tracer])
    commits = _counting_write_transactions(app.runtime.storage)
    stats = worker.run()

    assert stats.succeeded == JOBS
    # One by one, each ack would be a commit of its own (JOBS commits and more).
    assert commits[0] < JOBS * 0.6, f"{commits[0]} write transactions for {JOBS} jobs"
    spans = [s for s in exporter.get_finished_spans() if s.name == "replayq.attempt ping"]
    assert len(spans) == JOBS, "every attempt's span ended"
    # The outcome comes from the job.succeeded event of the ack's commit: the span was
    # still open when that commit's events arrived.
    assert {s.attributes["replayq.outcome"] for s in spans} == {"succeeded"}  # type: ignore[index]
    succeeded = {
        e.job_id: e.ts
        for j in app.list_jobs(limit=JOBS)
        for e in app.trace(j.id)
        if e.name == "job.succeeded"
    }
    assert len(succeeded) == JOBS
    for span in spans:
        job_id = span.attributes["replayq.job_id"]  # type: ignore[index]
        assert span.end_time / 1e9 >= succeeded[job_id] - 0.001  # type: ignore[operator]
    registry = metrics.registry
    assert registry.get_sample_value("replayq_worker_in_flight") == 0
    assert (
        registry.get_sample_value(
            "replayq_jobs_succeeded_total",
            {"job_type": "ping", "queue": "default", "version": "v1"},
        )
        == JOBS
    )
