-- Lineage: which original trace a replay, fork or rerun trace came from.
-- PostgreSQL flavour of storage/sqlite/lineage.sql: same query names and parameters.

-- name: lineage_put
INSERT INTO rq_lineage (trace_id, origin, source_trace_id, source_job_id, branch, details,
                        created_at)
VALUES (%(trace_id)s, %(origin)s, %(source_trace_id)s, %(source_job_id)s, %(branch)s, %(details)s, %(now)s);

-- name: lineage_list
-- Where one trace came from (``trace_id``), or every trace derived from ``source_trace_id``.
SELECT * FROM rq_lineage
WHERE (%(trace_id)s::text IS NULL OR trace_id = %(trace_id)s::text)
  AND (%(source_trace_id)s::text IS NULL OR source_trace_id = %(source_trace_id)s::text)
ORDER BY created_at, trace_id;

-- name: lineage_page
-- Derived traces after a (created_at, trace_id) cursor, oldest first (the fleet's replay
-- counters read each new one once).
SELECT * FROM rq_lineage
WHERE (created_at, trace_id) > (%(created_at)s::double precision, %(trace_id)s::text)
ORDER BY created_at, trace_id
LIMIT %(limit)s;
