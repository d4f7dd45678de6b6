-- 0004 trace context: the W3C traceparent of whoever enqueued the job (OpenTelemetry),
-- so a worker's attempt spans are children of the enqueuer's span. NULL when the
-- enqueuer had no active span or OpenTelemetry is not installed.

ALTER TABLE rq_jobs ADD COLUMN trace_context TEXT;
