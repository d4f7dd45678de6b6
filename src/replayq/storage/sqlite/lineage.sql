-- Lineage: which original trace a replay, fork or rerun trace came from.

-- name: lineage_put
INSERT INTO rq_lineage (trace_id, origin, source_trace_id, source_job_id, branch, details,
                        created_at)
VALUES (:trace_id, :origin, :source_trace_id, :source_job_id, :branch, :details, :now);

-- name: lineage_list
-- Where one trace came from (``trace_id``), or every trace derived from ``source_trace_id``.
SELECT * FROM rq_lineage
WHERE (:trace_id IS NULL OR trace_id = :trace_id)
  AND (:source_trace_id IS NULL OR source_trace_id = :source_trace_id)
ORDER BY created_at, trace_id;

-- name: lineage_page
-- Derived traces after a (created_at, trace_id) cursor, oldest first (the fleet's replay
-- counters read each new one once).
SELECT * FROM rq_lineage
WHERE created_at > :created_at OR (created_at = :created_at AND trace_id > :trace_id)
ORDER BY created_at, trace_id
LIMIT :limit;
