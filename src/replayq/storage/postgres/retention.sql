-- PostgreSQL flavour of storage/sqlite/retention.sql.
-- Retention and gc (queue/retention.py): pinned jobs, gc's cursor, trimming and deleting.

-- name: job_keep
INSERT INTO rq_keep (job_id, reason, kept_at) VALUES (%(job_id)s, %(reason)s, %(now)s)
ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, kept_at = excluded.kept_at;

-- name: keep_list
SELECT job_id, reason, kept_at FROM rq_keep ORDER BY job_id;

-- name: gc_candidates
-- Finished jobs past ``cutoff`` after the cursor, by id: never a kept one, never one
-- a replay, fork or rerun derived from on or after ``cutoff`` (still in use).
SELECT j.id AS job_id, j.job_type AS job_type, j.finished_at AS finished_at
FROM rq_jobs AS j
WHERE j.id > %(after)s::bigint
  AND j.state IN ('succeeded', 'dead', 'cancelled')
  AND j.finished_at IS NOT NULL AND j.finished_at < %(cutoff)s::double precision
  AND NOT EXISTS (SELECT 1 FROM rq_keep AS k WHERE k.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM rq_lineage AS l
                  WHERE l.source_job_id = j.id AND l.created_at >= %(cutoff)s::double precision)
ORDER BY j.id
LIMIT %(limit)s;

-- name: gc_cursor
SELECT cursor FROM rq_gc WHERE name = %(name)s;

-- name: gc_cursor_put
INSERT INTO rq_gc (name, cursor, updated_at) VALUES (%(name)s, %(cursor)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at;

-- name: trace_pack_rewrite
UPDATE rq_trace SET hlc = %(hlc)s, hlc_last = %(hlc_last)s, ts = %(ts)s, events = %(events)s WHERE id = %(id)s;

-- name: trace_pack_delete
DELETE FROM rq_trace WHERE id = %(id)s;

-- name: trace_pack_resources_delete
DELETE FROM rq_trace_resources WHERE pack_id = %(id)s;

-- name: job_steps_delete
DELETE FROM rq_steps WHERE job_id = %(job_id)s;

-- name: job_delete
DELETE FROM rq_jobs WHERE id = %(job_id)s;

-- name: gc_vacuum
-- Nothing on PostgreSQL: autovacuum reclaims the deleted rows' space.
SELECT 1;

-- name: idem_purge
-- A job's settled idempotency records (its effect keys may run again afterwards).
DELETE FROM rq_idempotency WHERE job_id = %(job_id)s AND status <> 'started';

-- name: job_hours_add
-- The job about to be deleted, counted into its hour (the aggregates tier).
INSERT INTO rq_job_hours (job_type, version, hour, state, jobs, attempts)
SELECT job_type, COALESCE(handler_version, ''), floor(finished_at / 3600) * 3600.0,
       state, 1, attempt
FROM rq_jobs WHERE id = %(job_id)s AND finished_at IS NOT NULL
ON CONFLICT (job_type, version, hour, state)
DO UPDATE SET jobs = rq_job_hours.jobs + 1,
              attempts = rq_job_hours.attempts + excluded.attempts;

-- name: job_hours
SELECT job_type, version, hour, state, jobs, attempts FROM rq_job_hours
WHERE (%(job_type)s::text IS NULL OR job_type = %(job_type)s::text)
ORDER BY hour, job_type, version, state;

-- name: job_trace_resources_delete
DELETE FROM rq_trace_resources
WHERE pack_id IN (SELECT id FROM rq_trace WHERE job_id = %(job_id)s);

-- name: job_trace_delete
DELETE FROM rq_trace WHERE job_id = %(job_id)s;
