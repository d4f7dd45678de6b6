-- Retention and gc (queue/retention.py): pinned jobs, gc's cursor, trimming and deleting.

-- name: job_keep
INSERT INTO rq_keep (job_id, reason, kept_at) VALUES (:job_id, :reason, :now)
ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, kept_at = excluded.kept_at;

-- name: keep_list
SELECT job_id, reason, kept_at FROM rq_keep ORDER BY job_id;

-- name: gc_candidates
-- Finished jobs past ``cutoff`` in the id window after the cursor (the primary key's
-- range), by id: never a kept one, never one
-- held by a live fork or dry-run, never one a replay, fork or rerun derived from on or
-- after ``cutoff`` (still in use).
SELECT j.id AS job_id, j.job_type AS job_type, j.handler_version AS version,
       j.finished_at AS finished_at
FROM rq_jobs AS j
WHERE j.id > :after AND j.id <= :until
  AND j.state IN ('succeeded', 'dead', 'cancelled')
  AND j.finished_at IS NOT NULL AND j.finished_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM rq_keep AS k WHERE k.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM rq_gc_holds AS h
                  WHERE h.job_id = j.id AND h.expires_at > :now)
  AND NOT EXISTS (SELECT 1 FROM rq_lineage AS l
                  WHERE l.source_job_id = j.id AND l.created_at >= :cutoff)
ORDER BY j.id
LIMIT :limit;

-- name: gc_highest_id
SELECT max(id) AS high FROM rq_jobs;

-- name: gc_cursor
SELECT cursor FROM rq_gc WHERE name = :name;

-- name: gc_cursor_put
INSERT INTO rq_gc (name, cursor, updated_at) VALUES (:name, :cursor, :now)
ON CONFLICT (name) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at;

-- name: trace_pack_rewrite
UPDATE rq_trace SET hlc = :hlc, hlc_last = :hlc_last, ts = :ts, events = :events WHERE id = :id;

-- name: gc_vacuum
PRAGMA incremental_vacuum(1000);

-- name: job_hours
SELECT job_type, version, hour, state, jobs, attempts FROM rq_job_hours
WHERE (:job_type IS NULL OR job_type = :job_type)
ORDER BY hour, job_type, version, state;

-- name: gc_hold_lock
-- A hold's job, locked against gc.
SELECT id FROM rq_jobs WHERE id = :job_id;

-- name: gc_hold_put
INSERT INTO rq_gc_holds (holder, job_id, expires_at)
VALUES (:holder, :job_id, :expires_at)
ON CONFLICT (holder) DO UPDATE SET job_id = excluded.job_id, expires_at = excluded.expires_at;

-- name: gc_hold_delete
DELETE FROM rq_gc_holds WHERE holder = :holder;

-- name: gc_derived
-- Derived traces without a job row of their own (dry-runs, forks, verifications; not
-- reruns, which acted on the world) created before ``cutoff``, after the cursor, oldest
-- first: never one of a pinned job, nor of a job held by a live fork or dry-run.
SELECT l.trace_id AS trace_id, l.origin AS origin, l.source_job_id AS source_job_id,
       j.job_type AS job_type, j.handler_version AS version, l.created_at AS created_at
FROM rq_lineage AS l
LEFT JOIN rq_jobs AS j ON j.id = l.source_job_id
WHERE l.created_at < :cutoff
  AND l.origin IN ('replay', 'fork')
  AND (l.created_at > :after_at
       OR (l.created_at = :after_at AND l.trace_id > :after_id))
  AND NOT EXISTS (SELECT 1 FROM rq_keep AS k WHERE k.job_id = l.source_job_id)
  AND NOT EXISTS (SELECT 1 FROM rq_gc_holds AS h
                  WHERE h.job_id = l.source_job_id AND h.expires_at > :now)
ORDER BY l.created_at, l.trace_id
LIMIT :limit;

-- name: gc_derived_lock
SELECT source_job_id, branch FROM rq_lineage WHERE trace_id = :trace_id;

-- name: gc_held_derived
SELECT 1 AS held FROM rq_gc_holds AS h
WHERE h.job_id = :source_job_id AND h.expires_at > :now;

-- name: gc_trace_derived
-- A derived trace's own packs (rq_trace_derived), not its job's: trace_for_trace would also
-- look the trace id up among jobs, which PostgreSQL without statistics plans as a scan of
-- both trace tables for each derived trace.
SELECT * FROM rq_trace WHERE trace_id = :trace_id AND job_id IS NULL;

-- name: derived_trace_delete
DELETE FROM rq_trace WHERE trace_id = :trace_id AND job_id IS NULL;

-- name: branch_versions_delete
DELETE FROM rq_entity_versions WHERE branch = :branch;

-- name: branch_entities_delete
DELETE FROM rq_entities WHERE branch = :branch;

-- name: branch_delete
DELETE FROM rq_branches WHERE branch = :branch;

-- name: lineage_delete
DELETE FROM rq_lineage WHERE trace_id = :trace_id;

-- name: gc_blobs
-- Blobs nobody stored since ``before`` that nothing references: no trace event (only
-- packs that name a blob at all are unpacked), state version, step or idempotency record.
-- rq_pack_json: a pack's events as JSON text, of any format (storage/packs.py).
-- b.hash is the SHA-256's 32 bytes (migration 0026): a reference names it in lower-case
-- hex, which SQLite 3.40 can write (hex) but not read back (no unhex); ordered by its
-- bytes, as by its hex. :after is bytes too (retention_verbs.py converts).
SELECT b.hash AS hash, b.stored_size AS stored_size
FROM rq_blobs AS b
WHERE b.hash > :after AND b.used_at < :before
  AND 'blob:sha256:' || lower(hex(b.hash)) NOT IN (
      SELECT ref FROM (
          SELECT json_extract(e.value, '$.i') AS ref FROM (SELECT rq_pack_json(events) AS events FROM rq_trace) AS p, json_each(p.events) AS e WHERE p.events LIKE '%blob:sha256:%'
          UNION ALL
          SELECT json_extract(e.value, '$.o') AS ref FROM (SELECT rq_pack_json(events) AS events FROM rq_trace) AS p, json_each(p.events) AS e WHERE p.events LIKE '%blob:sha256:%'
          UNION ALL
          SELECT data_ref AS ref FROM rq_entity_versions
          UNION ALL
          SELECT result_ref AS ref FROM rq_steps
          UNION ALL
          SELECT result_ref AS ref FROM rq_idempotency
      ) AS refs
      WHERE ref IS NOT NULL)
ORDER BY b.hash
LIMIT :limit;

-- name: blob_purge
-- The keys as bound values (VALUES (:rows): SqliteTransaction.rows_query), one row each:
-- JSON text cannot carry their bytes. Each is sought in the key's index.
DELETE FROM rq_blobs WHERE hash IN (VALUES (:rows)) AND used_at < :before;

-- name: trace_resource_delete
-- One resource index entry, by its primary key: the caller names the entries of the packs it
-- rewrites or deletes from their events (a delete by pack_id alone would scan the table).
DELETE FROM rq_trace_resources
WHERE resource = :resource AND hlc = :hlc AND pack_id = :pack_id;

-- name: gc_jobs_lock
-- A batch of jobs gc is about to trim or delete, still finished (the write transaction
-- serialises gc and holds).
SELECT id FROM rq_jobs
WHERE id IN (SELECT value FROM json_each(:job_ids)) AND state IN ('succeeded', 'dead', 'cancelled')
ORDER BY id;

-- name: gc_jobs_held
-- Read after gc_jobs_lock, in a statement of its own: sees every hold and pin committed before it.
SELECT job_id FROM rq_gc_holds WHERE job_id IN (SELECT value FROM json_each(:job_ids)) AND expires_at > :now
UNION
SELECT job_id FROM rq_keep WHERE job_id IN (SELECT value FROM json_each(:job_ids));

-- name: gc_trace_for_jobs
-- The full-tier packs of these jobs (rq_trace_job once per job), the ones gc trims or deletes.
SELECT * FROM rq_trace WHERE job_id IN (SELECT value FROM json_each(:job_ids));

-- name: trace_packs_delete
DELETE FROM rq_trace WHERE id IN (SELECT value FROM json_each(:ids));

-- name: jobs_hours_add
-- The jobs about to be deleted, counted into their hours (the aggregates tier).
INSERT INTO rq_job_hours (job_type, version, hour, state, jobs, attempts)
SELECT job_type, COALESCE(handler_version, ''), CAST(finished_at / 3600 AS INTEGER) * 3600.0, state, COUNT(*), SUM(attempt)
FROM rq_jobs WHERE id IN (SELECT value FROM json_each(:job_ids)) AND finished_at IS NOT NULL
GROUP BY 1, 2, 3, 4
ON CONFLICT (job_type, version, hour, state)
DO UPDATE SET jobs = rq_job_hours.jobs + excluded.jobs,
              attempts = rq_job_hours.attempts + excluded.attempts;

-- name: jobs_trace_delete
DELETE FROM rq_trace WHERE job_id IN (SELECT value FROM json_each(:job_ids));

-- name: jobs_steps_delete
DELETE FROM rq_steps WHERE job_id IN (SELECT value FROM json_each(:job_ids));

-- name: jobs_delete
DELETE FROM rq_jobs WHERE id IN (SELECT value FROM json_each(:job_ids));

-- name: idem_purge
-- These jobs' settled idempotency records (their effect keys may run again afterwards).
-- rq_idempotency_job.
DELETE FROM rq_idempotency WHERE job_id IN (SELECT value FROM json_each(:job_ids)) AND status <> 'started';

-- name: job_message_forget
UPDATE rq_jobs SET message_id = NULL WHERE id IN (SELECT value FROM json_each(:job_ids)) AND message_id IS NOT NULL;
