-- Questions across jobs by time: the trace in a window of the hybrid logical clock.
-- PostgreSQL flavour of storage/sqlite/window.sql: same query names and parameters.
-- name: trace_window
-- Production events (each job's own trace, not replays or forks) whose HLC lies in
-- [since_hlc, until_hlc), after the (after_hlc, after_id) cursor, in HLC order.
WITH packs AS MATERIALIZED (
    -- rq_trace_hlc: a pack's events lie in [hlc, hlc_last].
    SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace
    WHERE hlc_last >= %(since_hlc)s::bigint AND hlc < %(until_hlc)s::bigint
    UNION ALL
    -- rq_trace_ledger_hlc: the ledger tier (0013).
    SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace_ledger
    WHERE hlc_last >= %(since_hlc)s::bigint AND hlc < %(until_hlc)s::bigint
), e AS (
    -- The view rq_events over these packs alone (same columns).
    SELECT p.id * 1024 + x.pos - 1 AS id, p.trace_id, p.job_id, p.attempt,
           COALESCE(x.ev ->> 'k', 'domain') AS kind, x.ev ->> 'n' AS name,
           (x.ev ->> 'q')::integer AS seq, x.ev ->> 's' AS step, p.ts + COALESCE((x.ev ->> 'dt')::bigint, 0) / 1e6::float8 AS ts,
           p.hlc + COALESCE((x.ev ->> 'h')::bigint, 0) AS hlc, p.worker_id,
           x.ev ->> 'st' AS status, x.ev ->> 'r' AS resource,
           (x.ev ->> 'v')::bigint AS resource_version,
           COALESCE((x.ev ->> 'x')::integer, 0) AS side_effect, x.ev ->> 'i' AS input_ref,
           x.ev ->> 'o' AS output_ref, COALESCE((x.ev -> 'd')::text, '{}') AS data
    FROM packs AS p
    CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) WITH ORDINALITY AS x(ev, pos)
)
SELECT e.*, j.job_type AS job_type, j.handler_version AS version
FROM e
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
WITH packs AS MATERIALIZED (
    -- rq_trace_hlc: a pack's events lie in [hlc, hlc_last].
    SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace
    WHERE hlc_last >= %(since_hlc)s::bigint AND hlc < %(until_hlc)s::bigint
    UNION ALL
    -- rq_trace_ledger_hlc: the ledger tier (0013).
    SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace_ledger
    WHERE hlc_last >= %(since_hlc)s::bigint AND hlc < %(until_hlc)s::bigint
), e AS (
    -- The view rq_events over these packs alone (same columns).
    SELECT p.id * 1024 + x.pos - 1 AS id, p.trace_id, p.job_id, p.attempt,
           COALESCE(x.ev ->> 'k', 'domain') AS kind, x.ev ->> 'n' AS name,
           (x.ev ->> 'q')::integer AS seq, x.ev ->> 's' AS step, p.ts + COALESCE((x.ev ->> 'dt')::bigint, 0) / 1e6::float8 AS ts,
           p.hlc + COALESCE((x.ev ->> 'h')::bigint, 0) AS hlc, p.worker_id,
           x.ev ->> 'st' AS status, x.ev ->> 'r' AS resource,
           (x.ev ->> 'v')::bigint AS resource_version,
           COALESCE((x.ev ->> 'x')::integer, 0) AS side_effect, x.ev ->> 'i' AS input_ref,
           x.ev ->> 'o' AS output_ref, COALESCE((x.ev -> 'd')::text, '{}') AS data
    FROM packs AS p
    CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) WITH ORDINALITY AS x(ev, pos)
)
SELECT ((e.hlc >> 16) / %(bucket_ms)s::bigint) * %(bucket_ms)s::bigint AS bucket_ms,
       j.job_type AS job_type, j.handler_version AS version, e.name AS name,
       COUNT(*) AS count
FROM e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.name = ANY(%(names)s::text[])
  AND j.origin = 'production'
  AND e.hlc >= %(since_hlc)s::bigint AND e.hlc < %(until_hlc)s::bigint
GROUP BY 1, j.job_type, j.handler_version, e.name
ORDER BY 1, j.job_type, j.handler_version, e.name;
