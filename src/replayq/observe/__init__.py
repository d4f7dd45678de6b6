"""Observability: what a worker, the fleet and the trace look like from outside.

Everything here is derived from the trace. A worker registers its observers as
listeners of committed trace events (``replayq.storage.tap``) and tells them
when an attempt starts and ends; nothing in the queue or the recording context
knows it is observed::

    hooks      Observer (no-op base), Observers (fan-out) and ReleaseReason (why a leased
               job left unrun), the worker's only door here
    metrics    WorkerMetrics: Prometheus counters and histograms from committed events
    fleet      FleetCollector: gauges read from the database at scrape time
    logs       configure_logging (text | json) and the job fields on every record
    otel       AttemptTracer: an OpenTelemetry span per attempt, children per step/call/effect

Third-party packages (``prometheus_client``, ``opentelemetry``) are imported only
by the module that needs them, so ``import replayq`` needs neither.
"""
