-- Questions across jobs by time: the trace in a window of the hybrid logical clock.
-- PostgreSQL flavour of storage/sqlite/window.sql: same query names and parameters.
-- name: trace_window
-- Production events (each job's own trace, not replays or forks) whose HLC lies in
-- [since_hlc, until_hlc), after the (after_hlc, after_id) cursor, in HLC order.
SELECT e.*, j.job_type AS job_type, j.handler_version AS version
FROM rq_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.hlc >= %(since_hlc)s::bigint AND e.hlc < %(until_hlc)s::bigint
  AND (e.hlc > %(after_hlc)s::bigint OR (e.hlc = %(after_hlc)s::bigint AND e.id > %(after_id)s::bigint))
  AND j.origin = 'production'
  AND (%(job_type)s::text IS NULL OR j.job_type = %(job_type)s::text)
  AND (%(version)s::text IS NULL OR j.handler_version = %(version)s::text)
  AND (%(name)s::text IS NULL OR e.name = %(name)s::text)
  AND (%(resource)s::text IS NULL
       OR substr(e.resource, 1, length(%(resource)s::text)) = %(resource)s::text)
ORDER BY e.hlc, e.id
LIMIT %(limit)s;

-- name: signal_series
-- Signal events per bucket of the HLC's wall-clock part, per job type and version.
SELECT ((e.hlc >> 16) / %(bucket_ms)s::bigint) * %(bucket_ms)s::bigint AS bucket_ms,
       j.job_type AS job_type, j.handler_version AS version, e.name AS name,
       COUNT(*) AS count
FROM rq_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.name = ANY(%(names)s::text[])
  AND j.origin = 'production'
  AND e.hlc >= %(since_hlc)s::bigint AND e.hlc < %(until_hlc)s::bigint
GROUP BY 1, j.job_type, j.handler_version, e.name
ORDER BY 1, j.job_type, j.handler_version, e.name;
