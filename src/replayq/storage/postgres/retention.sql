-- PostgreSQL flavour of storage/sqlite/retention.sql.
-- Retention and gc (queue/retention.py): pinned jobs, gc's cursor, trimming and deleting.

-- name: job_keep
INSERT INTO rq_keep (job_id, reason, kept_at) VALUES (%(job_id)s, %(reason)s, %(now)s)
ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, kept_at = excluded.kept_at;

-- name: keep_list
SELECT job_id, reason, kept_at FROM rq_keep ORDER BY job_id;

-- name: gc_candidates
-- Finished jobs past ``cutoff`` in the id window after the cursor (the primary key's
-- range: without it PostgreSQL planned a scan of every job before statistics), by id: never a kept one, never one
-- held by a live fork or dry-run, never one a replay, fork or rerun derived from on or
-- after ``cutoff`` (still in use).
SELECT j.id AS job_id, j.job_type AS job_type, j.handler_version AS version,
       j.finished_at AS finished_at
FROM rq_jobs AS j
WHERE j.id > %(after)s::bigint AND j.id <= %(until)s::bigint
  AND j.state IN ('succeeded', 'dead', 'cancelled')
  AND j.finished_at IS NOT NULL AND j.finished_at < %(cutoff)s::double precision
  AND NOT EXISTS (SELECT 1 FROM rq_keep AS k WHERE k.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM rq_gc_holds AS h
                  WHERE h.job_id = j.id AND h.expires_at > %(now)s::double precision)
  AND NOT EXISTS (SELECT 1 FROM rq_lineage AS l
                  WHERE l.source_job_id = j.id AND l.created_at >= %(cutoff)s::double precision)
ORDER BY j.id
LIMIT %(limit)s;

-- name: gc_highest_id
SELECT max(id) AS high FROM rq_jobs;

-- name: gc_cursor
SELECT cursor FROM rq_gc WHERE name = %(name)s;

-- name: gc_cursor_put
INSERT INTO rq_gc (name, cursor, updated_at) VALUES (%(name)s, %(cursor)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at;

-- name: trace_pack_rewrite
UPDATE rq_trace SET hlc = %(hlc)s, hlc_last = %(hlc_last)s, ts = %(ts)s, events = %(events)s WHERE id = %(id)s;

-- name: gc_vacuum
-- Nothing on PostgreSQL: autovacuum reclaims the deleted rows' space.
SELECT 1;

-- name: job_hours
SELECT job_type, version, hour, state, jobs, attempts FROM rq_job_hours
WHERE (%(job_type)s::text IS NULL OR job_type = %(job_type)s::text)
ORDER BY hour, job_type, version, state;

-- name: gc_hold_lock
-- A hold's job, locked against gc (FOR SHARE: gc locks it FOR UPDATE before it trims).
SELECT id FROM rq_jobs WHERE id = %(job_id)s FOR SHARE;

-- name: gc_hold_put
INSERT INTO rq_gc_holds (holder, job_id, expires_at)
VALUES (%(holder)s, %(job_id)s, %(expires_at)s)
ON CONFLICT (holder) DO UPDATE SET job_id = excluded.job_id, expires_at = excluded.expires_at;

-- name: gc_hold_delete
DELETE FROM rq_gc_holds WHERE holder = %(holder)s;

-- name: gc_derived
-- Derived traces without a job row of their own (dry-runs, forks, verifications; not
-- reruns, which acted on the world) created before ``cutoff``, after the cursor, oldest
-- first: never one of a pinned job, nor of a job held by a live fork or dry-run.
SELECT l.trace_id AS trace_id, l.origin AS origin, l.source_job_id AS source_job_id,
       j.job_type AS job_type, j.handler_version AS version, l.created_at AS created_at
FROM rq_lineage AS l
LEFT JOIN rq_jobs AS j ON j.id = l.source_job_id
WHERE l.created_at < %(cutoff)s::double precision
  AND l.origin IN ('replay', 'fork')
  AND (l.created_at > %(after_at)s::double precision
       OR (l.created_at = %(after_at)s::double precision AND l.trace_id > %(after_id)s::text))
  AND NOT EXISTS (SELECT 1 FROM rq_keep AS k WHERE k.job_id = l.source_job_id)
  AND NOT EXISTS (SELECT 1 FROM rq_gc_holds AS h
                  WHERE h.job_id = l.source_job_id AND h.expires_at > %(now)s::double precision)
ORDER BY l.created_at, l.trace_id
LIMIT %(limit)s;

-- name: gc_derived_lock
SELECT source_job_id, branch FROM rq_lineage WHERE trace_id = %(trace_id)s FOR UPDATE;

-- name: gc_held_derived
SELECT 1 AS held FROM rq_gc_holds AS h
WHERE h.job_id = %(source_job_id)s AND h.expires_at > %(now)s::double precision;

-- name: gc_trace_derived
-- A derived trace's own packs (rq_trace_derived), not its job's: trace_for_trace would also
-- look the trace id up among jobs, which PostgreSQL without statistics plans as a scan of
-- both trace tables for each derived trace.
SELECT * FROM rq_trace WHERE trace_id = %(trace_id)s AND job_id IS NULL;

-- name: derived_trace_delete
DELETE FROM rq_trace WHERE trace_id = %(trace_id)s AND job_id IS NULL;

-- name: branch_versions_delete
DELETE FROM rq_entity_versions WHERE branch = %(branch)s;

-- name: branch_entities_delete
DELETE FROM rq_entities WHERE branch = %(branch)s;

-- name: branch_delete
DELETE FROM rq_branches WHERE branch = %(branch)s;

-- name: lineage_delete
DELETE FROM rq_lineage WHERE trace_id = %(trace_id)s;

-- name: gc_blobs
-- Blobs nobody stored since ``before`` that nothing references: no trace event (only
-- packs that name a blob at all are unpacked), state version, step or idempotency record.
-- b.hash is the SHA-256's 32 bytes (bytea, migration 0026): a reference names it in
-- lower-case hex (encode). %(after)s is bytes too (retention_verbs.py converts).
SELECT b.hash AS hash, b.stored_size AS stored_size
FROM rq_blobs AS b
WHERE b.hash > %(after)s::bytea AND b.used_at < %(before)s::double precision
  AND 'blob:sha256:' || encode(b.hash, 'hex') NOT IN (
      SELECT ref FROM (
          SELECT e.ev ->> 'i' AS ref FROM rq_trace AS p CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) AS e(ev) WHERE p.events LIKE '%%blob:sha256:%%'
          UNION ALL
          SELECT e.ev ->> 'o' AS ref FROM rq_trace AS p CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) AS e(ev) WHERE p.events LIKE '%%blob:sha256:%%'
          UNION ALL
          SELECT e.ev ->> 'i' AS ref FROM rq_trace_ledger AS p CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) AS e(ev) WHERE p.events LIKE '%%blob:sha256:%%'
          UNION ALL
          SELECT e.ev ->> 'o' AS ref FROM rq_trace_ledger AS p CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) AS e(ev) WHERE p.events LIKE '%%blob:sha256:%%'
          UNION ALL
          SELECT data_ref AS ref FROM rq_entity_versions
          UNION ALL
          SELECT result_ref AS ref FROM rq_steps
          UNION ALL
          SELECT result_ref AS ref FROM rq_idempotency
      ) AS refs
      WHERE ref IS NOT NULL)
ORDER BY b.hash
LIMIT %(limit)s;

-- name: blob_purge
-- The keys' bytes as one array (rows_param: a column of rows_executed's rows).
DELETE FROM rq_blobs WHERE hash = ANY(%(hashes)s::bytea[]) AND used_at < %(before)s::double precision;

-- name: trace_resource_delete
-- One resource index entry, by its primary key: the caller names the entries of the packs it
-- rewrites or deletes from their events (a delete by pack_id alone would scan the table).
DELETE FROM rq_trace_resources
WHERE resource = %(resource)s AND hlc = %(hlc)s AND pack_id = %(pack_id)s;

-- name: gc_jobs_lock
-- A batch of jobs gc is about to trim or delete, still finished, locked (a hold waits for
-- gc to commit); a row locked by a hold being taken is skipped, not waited for.
SELECT id FROM rq_jobs
WHERE id = ANY(%(job_ids)s::bigint[]) AND state IN ('succeeded', 'dead', 'cancelled')
ORDER BY id FOR UPDATE SKIP LOCKED;

-- name: gc_jobs_held
-- Read after gc_jobs_lock, in a statement of its own: sees every hold and pin committed before it.
SELECT job_id FROM rq_gc_holds WHERE job_id = ANY(%(job_ids)s::bigint[]) AND expires_at > %(now)s::double precision
UNION
SELECT job_id FROM rq_keep WHERE job_id = ANY(%(job_ids)s::bigint[]);

-- name: gc_trace_for_jobs
-- The full-tier packs of these jobs (rq_trace_job), the ones gc trims or deletes. The range
-- of the batch's ids keeps the plan an index scan without statistics (autovacuum off, a
-- table just loaded): alone, "= ANY(array)" is estimated at 0.5% of the table per element
-- and read with a sequential scan of the whole trace each batch.
SELECT * FROM rq_trace
WHERE job_id BETWEEN %(low)s::bigint AND %(high)s::bigint AND job_id = ANY(%(job_ids)s::bigint[]);

-- name: trace_packs_delete
DELETE FROM rq_trace WHERE id = ANY(%(ids)s::bigint[]);

-- name: jobs_hours_add
-- The jobs about to be deleted, counted into their hours (the aggregates tier).
INSERT INTO rq_job_hours (job_type, version, hour, state, jobs, attempts)
SELECT job_type, COALESCE(handler_version, ''), floor(finished_at / 3600) * 3600.0, state, COUNT(*), SUM(attempt)
FROM rq_jobs WHERE id = ANY(%(job_ids)s::bigint[]) AND finished_at IS NOT NULL
GROUP BY 1, 2, 3, 4
ON CONFLICT (job_type, version, hour, state)
DO UPDATE SET jobs = rq_job_hours.jobs + excluded.jobs,
              attempts = rq_job_hours.attempts + excluded.attempts;

-- name: jobs_trace_delete
-- The range: as in gc_trace_for_jobs.
DELETE FROM rq_trace
WHERE job_id BETWEEN %(low)s::bigint AND %(high)s::bigint AND job_id = ANY(%(job_ids)s::bigint[]);

-- name: jobs_steps_delete
-- The range: as in gc_trace_for_jobs.
DELETE FROM rq_steps
WHERE job_id BETWEEN %(low)s::bigint AND %(high)s::bigint AND job_id = ANY(%(job_ids)s::bigint[]);

-- name: jobs_delete
DELETE FROM rq_jobs WHERE id = ANY(%(job_ids)s::bigint[]);

-- name: idem_purge
-- These jobs' settled idempotency records (their effect keys may run again afterwards).
-- rq_idempotency_job; the range: as in gc_trace_for_jobs (a plan without statistics).
DELETE FROM rq_idempotency
WHERE job_id BETWEEN %(low)s::bigint AND %(high)s::bigint AND job_id = ANY(%(job_ids)s::bigint[])
  AND status <> 'started';

-- name: job_message_forget
UPDATE rq_jobs SET message_id = NULL WHERE id = ANY(%(job_ids)s::bigint[]) AND message_id IS NOT NULL;

-- name: ledger_partition
-- The ledger partitions of the day of ``expires_at``, made if missing (migration 0013).
SELECT rq_trace_ledger_partition(%(expires_at)s::double precision) AS made;

-- name: ledger_drop
-- The ledger partitions of the days that ended before ``now`` with none of their jobs left,
-- after the partition ``after``, at most ``max_days`` of them; those the owner's objects
-- depend on are kept, each with the server's detail; ``last``: where to go on (0024).
SELECT dropped, kept, last
FROM rq_trace_ledger_drop_days(%(now)s::double precision, %(after)s::text, %(max_days)s::integer);

-- name: ledger_pack_insert
-- A job's pack as its ledger tier keeps it, same id, into the partition of its expiry day.
INSERT INTO rq_trace_ledger (id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events, expires_at)
VALUES (%(id)s, %(trace_id)s, %(job_id)s, %(attempt)s, %(worker_id)s, %(hlc)s, %(hlc_last)s, %(ts)s,
        %(events)s, %(expires_at)s);

-- name: ledger_resources_append
INSERT INTO rq_trace_ledger_resources (resource, hlc, pack_id, expires_at)
VALUES (%(resource)s, %(hlc)s, %(pack_id)s, %(expires_at)s)
ON CONFLICT DO NOTHING;

-- name: ledger_unmove
-- A job pinned after it moved to its ledger tier: its packs and their index entries back
-- into rq_trace (same ids), out of the partition that gc will drop.
WITH packs AS (
    DELETE FROM rq_trace_ledger WHERE job_id = %(job_id)s
    RETURNING id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events, expires_at
), entries AS (
    DELETE FROM rq_trace_ledger_resources AS r USING packs AS p
    WHERE r.pack_id = p.id AND r.expires_at = p.expires_at
    RETURNING r.resource, r.hlc, r.pack_id
), moved_entries AS (
    INSERT INTO rq_trace_resources (resource, hlc, pack_id)
    SELECT resource, hlc, pack_id FROM entries
    ON CONFLICT DO NOTHING
)
INSERT INTO rq_trace (id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM packs;
