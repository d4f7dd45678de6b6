"""OpenTelemetry: a span per attempt, children per step, ``ctx.call`` and ``ctx.effect``.

Needs ``replayq[otel]`` and a configured ``TracerProvider`` (without one the API's
no-op tracer makes all of this free). The shape:

* ``App.enqueue`` runs inside a ``replayq.enqueue TYPE`` producer span (a child of
  the caller's active span) and stores its W3C ``traceparent`` in the job row;
* the worker's attempt is a consumer span ``replayq.attempt TYPE``, child of that
  context, current on the executor thread while the handler runs (the handler's own
  spans nest under it), linked to the earlier attempts of the same job this process
  ran, with ``replayq.trace_id``, ``replayq.job_id``, ``replayq.attempt``,
  ``replayq.version`` and ``replayq.worker_id`` as attributes;
* steps, calls and effects become child spans when their step commits, built from the
  committed events with their recorded start and duration (so a rolled-back step is
  still shown, as failed, and nothing is reported that did not commit).

``otel_provider_from_env`` is what ``replayq worker --otel`` uses: a ``TracerProvider``
configured only by the standard ``OTEL_*`` environment variables, the way every
OpenTelemetry SDK reads them, so nothing replayq-specific has to be learnt.

Known limit: links to earlier attempts reach only attempts run by this process (the
span ids of another worker's attempts are not stored).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from replayq.errors import ConfigurationError
from replayq.model import Job, TraceEvent
from replayq.observe.hooks import Observer

SPAN_EVENTS = {
    "call",
    "effect.succeeded",
    "effect.failed",
    "effect.deduplicated",
    "effect.in_doubt",
}
OUTCOMES = {"job.succeeded", "job.failed", "job.write_rejected"}


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


class _Api:
    """The OpenTelemetry API's parts ``enqueue_span`` uses, imported once (``load``)."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.propagator = TraceContextTextMapPropagator
        # A tuple, not ``A | B``: the union would be built again at each isinstance.
        self.no_op = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


# ``False`` until the first enqueue looks; then the API, or ``None`` if not installed.
_API: _Api | bool | None = False


def _api() -> _Api | None:
    """The OpenTelemetry API, imported at the first enqueue rather than at import time (an
    import statement in the enqueue itself cost ~3 µs each time)."""
    global _API
    if _API is False:
        try:
            _API = _Api()
        except ImportError:
            _API = None
    assert _API is not True
    return _API


@contextmanager
def enqueue_span(job_type: str) -> Iterator[str | None]:
    """The producer span of an enqueue; yields its W3C traceparent for the job row.

    Yields ``None`` when OpenTelemetry is not installed or no provider records spans.
    """
    api = _api()
    if api is None:
        yield None
        return
    trace = api.trace
    if (
        isinstance(trace.get_tracer_provider(), api.no_op)
        and not trace.get_current_span().get_span_context().is_valid
    ):
        # No provider and no caller's span: the span would be the invalid no-op one and
        # carry no context. Skipping it saves ~30 µs per enqueue (a third of its Python).
        yield None
        return
    tracer = trace.get_tracer("replayq")
    with tracer.start_as_current_span(
        f"replayq.enqueue {job_type}", kind=trace.SpanKind.PRODUCER
    ) as span:
        carrier: dict[str, str] = {}
        api.propagator().inject(carrier, context=trace.set_span_in_context(span))
        yield carrier.get("traceparent")


def otel_provider_from_env(default_service: str = "replayq-worker") -> Any:
    """A ``TracerProvider`` built from the standard ``OTEL_*`` variables; ``None`` if disabled.

    * ``OTEL_TRACES_EXPORTER``: comma-separated exporter names, looked up in the
      ``opentelemetry_traces_exporter`` entry points as the SDK's own configurator does
      (``otlp``, the default, needs ``opentelemetry-exporter-otlp``; ``console`` ships
      with the SDK; ``none`` exports nothing);
    * ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``: the resource (service name
      ``default_service`` when neither names one);
    * ``OTEL_TRACES_SAMPLER`` (and ``_ARG``), ``OTEL_BSP_*`` and each exporter's own
      variables (``OTEL_EXPORTER_OTLP_ENDPOINT``...): read by the SDK itself;
    * ``OTEL_SDK_DISABLED=true``: returns ``None``.

    Spans leave through a ``BatchSpanProcessor``; call ``shutdown()`` on the provider
    to flush them before the process exits.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from importlib.metadata import entry_points

        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            f"OpenTelemetry needs the otel extra: pip install 'replayq[otel]' ({exc})"
        ) from exc
    detected = OTELResourceDetector().detect().attributes
    resource = Resource.create(
        {} if "service.name" in detected else {"service.name": default_service}
    )
    provider = TracerProvider(resource=resource)
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in [n for n in names if n and n != "none"]:
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            hint = " (pip install opentelemetry-exporter-otlp)" if name == "otlp" else ""
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER names {name!r}: no such span exporter is installed{hint}"
            )
        exporter_class = next(iter(found)).load()
        provider.add_span_processor(BatchSpanProcessor(exporter_class()))
    return provider


def otel_trace_id(traceparent: str | None) -> str | None:
    """The OpenTelemetry trace id in a W3C ``traceparent`` (``00-TRACE-SPAN-FLAGS``)."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


class AttemptTracer(Observer):
    """Spans for a worker's attempts; ``provider`` defaults to the global tracer provider."""

    def __init__(self, provider: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = trace.get_tracer("replayq", tracer_provider=provider)
        self._open: dict[int, Any] = {}
        self._earlier: dict[int, list[Any]] = {}
        self._outcomes: dict[int, str] = {}
        # Calls and effects waiting for their step's span: an effect's claim and outcome
        # commit at once, before the step that holds them commits.
        self._waiting: dict[int, list[TraceEvent]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def attempt(self, job: Job, worker_id: str) -> Iterator[None]:
        from opentelemetry.trace import Link, SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = None
        if job.trace_context:
            parent = TraceContextTextMapPropagator().extract({"traceparent": job.trace_context})
        with self._lock:
            earlier = list(self._earlier.get(job.id, []))
        attributes: dict[str, Any] = {
            "replayq.trace_id": job.trace_id,
            "replayq.job_id": job.id,
            "replayq.job_type": job.job_type,
            "replayq.attempt": job.attempt,
            "replayq.version": job.handler_version or "",
            "replayq.queue": job.queue,
            "replayq.worker_id": worker_id,
        }
        span = self.tracer.start_span(
            f"replayq.attempt {job.job_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=[Link(c, {"replayq.attempt": n}) for n, c in earlier],
            attributes=attributes,
        )
        with self._lock:
            self._open[job.id] = span
        # Current while the handler runs; it ends when the attempt is settled (``settled``),
        # which for a grouped ack comes after the group's commit, on another thread.
        with self._trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield

    def settled(self, job: Job) -> None:
        from opentelemetry.trace import Status, StatusCode

        with self._lock:
            span = self._open.pop(job.id, None)
            if span is None:
                return
            orphans = self._waiting.pop(job.id, [])
            self._earlier.setdefault(job.id, []).append((job.attempt, span.get_span_context()))
            if len(self._earlier) > 10_000:
                self._earlier.pop(next(iter(self._earlier)))
            outcome = self._outcomes.pop(job.id, None)
        self._spans_for(orphans, span, {})
        if outcome in ("failed", "rejected"):
            span.set_status(Status(StatusCode.ERROR, str(outcome)))
        span.end()

    def events(self, events: Sequence[TraceEvent]) -> None:
        by_job: dict[int, list[TraceEvent]] = {}
        for event in events:
            if event.job_id is not None:
                by_job.setdefault(event.job_id, []).append(event)
        for job_id, chunk in by_job.items():
            with self._lock:
                attempt_span = self._open.get(job_id)
            if attempt_span is not None:
                self._children(attempt_span, chunk)

    def _children(self, attempt_span: Any, chunk: list[TraceEvent]) -> None:
        from opentelemetry.trace import Status, StatusCode

        trace = self._trace
        steps: dict[str, Any] = {}
        for event in chunk:
            if event.name == "step.finished":
                name = str(event.data.get("step_name"))
                duration = float(event.data.get("duration") or 0.0)
                span = self.tracer.start_span(
                    f"step {name}",
                    context=trace.set_span_in_context(attempt_span),
                    start_time=_ns(event.ts - duration),
                    attributes={"replayq.step": name, "replayq.status": event.status or ""},
                )
                if event.status == "fail":
                    span.set_status(Status(StatusCode.ERROR, str(event.data.get("error"))))
                span.end(end_time=_ns(event.ts))
                steps[name] = span
            elif event.name in OUTCOMES:
                outcome = {"job.succeeded": "succeeded", "job.failed": "failed"}.get(
                    event.name, "rejected"
                )
                attempt_span.set_attribute("replayq.outcome", outcome)
                if event.job_id is not None:
                    with self._lock:
                        self._outcomes[event.job_id] = outcome
                if event.data.get("error_class"):
                    attempt_span.set_attribute("replayq.error_class", event.data["error_class"])
        with self._lock:
            waiting = self._waiting.setdefault(chunk[0].job_id or 0, [])
            waiting.extend(e for e in chunk if e.name in SPAN_EVENTS)
            ready = [e for e in waiting if not e.step or e.step in steps]
            waiting[:] = [e for e in waiting if e not in ready]
        self._spans_for(ready, attempt_span, steps)

    def _spans_for(
        self, events: Sequence[TraceEvent], attempt_span: Any, steps: dict[str, Any]
    ) -> None:
        """A span per call or effect, under its step's span (else the attempt's)."""
        from opentelemetry.trace import Status, StatusCode

        trace = self._trace
        for event in events:
            parent = steps.get(event.step or "", attempt_span)
            duration = float(event.data.get("duration") or 0.0)
            what = event.data.get("call") or event.data.get("kind") or ""
            span = self.tracer.start_span(
                f"{'call' if event.name == 'call' else 'effect'} {what}",
                context=trace.set_span_in_context(parent),
                start_time=_ns(event.ts - duration),
                attributes={
                    "replayq.event": event.name,
                    "replayq.status": event.status or "",
                    "replayq.side_effect": event.side_effect,
                    **({"replayq.key": str(event.data["key"])} if event.data.get("key") else {}),
                },
            )
            if event.status == "fail":
                span.set_status(Status(StatusCode.ERROR, str(event.data.get("error"))))
            span.end(end_time=_ns(event.ts))
