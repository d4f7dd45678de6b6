"""OpenTelemetry spans of a real worker, caught by the SDK's in-memory exporter.

One span per attempt, a child of the span that enqueued the job (its context rode
in the job row); the retry linked to the first attempt; steps, calls and effects
as children with their recorded timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import replayq

AppFactory = Callable[..., replayq.App]


def test_attempt_spans_have_the_enqueuers_parent_linked_retries_and_step_children(
    app_factory: AppFactory,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = app_factory()

    @app.job("pay", retry=replayq.Retry(max_attempts=3, base="10ms", cap="10ms", jitter="none"))
    def pay(ctx: replayq.Context, order_id: int) -> str:
        with ctx.step("quote"):
            ctx.call("gateway.quote", lambda: {"amount": 12})
        with ctx.step("charge"):
            ctx.effect("payments.charge", lambda: "ch-1", key=f"charge:{order_id}")
            if ctx.attempt == 1:
                raise replayq.TransientError("gateway timed out after charging")
        return "paid"

    checkout = provider.get_tracer("shop").start_as_current_span("checkout")
    with checkout as parent:
        job_id = app.enqueue("pay", {"order_id": 1})
    assert replayq.otel_trace_id(app.get_job(job_id).trace_context) == format(
        parent.get_span_context().trace_id, "032x"
    )

    tracer = replayq.AttemptTracer(provider)
    deadline = time.monotonic() + 30
    while app.get_job(job_id).state != "succeeded":
        assert time.monotonic() < deadline, "the job never succeeded"
        replayq.Worker(app, burst=True, observers=[tracer], poll_interval=0.01).run()
        time.sleep(0.02)

    spans = exporter.get_finished_spans()
    attempts = sorted(
        (s for s in spans if s.name == "replayq.attempt pay"),
        key=lambda s: s.attributes["replayq.attempt"],  # type: ignore[index]
    )
    assert [s.attributes["replayq.attempt"] for s in attempts] == [1, 2]  # type: ignore[index]
    first, second = attempts
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.context.trace_id == parent.get_span_context().trace_id
        assert span.attributes["replayq.job_id"] == job_id  # type: ignore[index]
        assert span.attributes["replayq.trace_id"] == app.get_job(job_id).trace_id  # type: ignore[index]
        assert span.attributes["replayq.version"] == "v1"  # type: ignore[index]
    assert first.status.status_code == StatusCode.ERROR
    assert second.status.status_code != StatusCode.ERROR
    assert [link.context.span_id for link in second.links] == [first.context.span_id]

    def children(of: Any) -> dict[str, Any]:
        return {s.name: s for s in spans if s.parent and s.parent.span_id == of.context.span_id}

    steps = children(first)
    assert set(steps) == {"step quote", "step charge"}
    assert steps["step charge"].status.status_code == StatusCode.ERROR
    assert set(children(steps["step quote"])) == {"call gateway.quote"}
    [effect] = children(steps["step charge"]).values()
    assert effect.name == "effect payments.charge"
    assert effect.attributes["replayq.event"] == "effect.succeeded"  # type: ignore[index]
    # The retry did not charge again: its effect span says deduplicated.
    [again] = children(children(second)["step charge"]).values()
    assert again.attributes["replayq.event"] == "effect.deduplicated"  # type: ignore[index]
    for child in (*steps.values(), effect):
        assert first.start_time <= child.start_time <= child.end_time <= first.end_time  # type: ignore[operator]
