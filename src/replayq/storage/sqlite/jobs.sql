-- Named queries for the SQLite backend. Each begins with "-- name: NAME".
-- Parameters are named (:name); no query is built from strings at run time.

-- name: job_insert
-- The new id is the cursor's lastrowid (no row inserted: rowcount 0). RETURNING would
-- build a temporary table at each run (SqliteTransaction.inserted_id). The id is SQLite's
-- max(id) + 1 (NULL here) unless a delete took the newest job: then the floor + 1, so no
-- id is given twice (migration 0017; a seek in rq_gc, no write).
-- The job's job.enqueued pack is in the row (migration 0023): enqueued_hlc and enqueued,
-- pack format 3 (storage/lifecycle_packs.py): b'\x03' and the JSON array [run_at, priority,
-- message_id, ordering_key, causation_id], trailing nulls left out. run_at is written with
-- 17 significant digits, which give back the same double for every run_at replayq accepts
-- (|run_at| < 1e15, queue/enqueue.py); the other values with json_quote. rtrim(..., ',nul')
-- drops the trailing nulls only: the text before them ends with a digit (priority) or a
-- closing quote.
INSERT INTO rq_jobs (id, job_type, queue, payload, state, priority, run_at, created_at,
                     max_attempts, trace_id, message_id, ordering_key, idempotency_key,
                     handler_version, hlc, correlation_id, causation_id, origin, trace_context,
                     enqueued_hlc, enqueued)
VALUES ((SELECT g.cursor + 1 FROM rq_gc AS g
         WHERE g.name = 'job_id_floor'
           AND g.cursor >= COALESCE((SELECT MAX(j.id) FROM rq_jobs AS j), 0)),
        :job_type, :queue, :payload_json, 'queued', :priority, :run_at, :now,
        :max_attempts, :trace_id, :message_id, :ordering_key, :idempotency_key,
        :handler_version, :hlc, :correlation_id, :causation_id, :origin, :trace_context,
        :hlc, CAST(x'03' || '[' || rtrim(
            printf('%!.17g', :run_at) || ',' || :priority
            || ',' || json_quote(:message_id)
            || ',' || json_quote(:ordering_key)
            || ',' || json_quote(:causation_id), ',nul') || ']' AS BLOB))
ON CONFLICT (job_type, message_id) DO NOTHING;

-- name: job_by_message_id
-- Message-id dedup is per job type (rq_jobs_message).
SELECT id FROM rq_jobs WHERE job_type = :job_type AND message_id = :message_id;

-- name: job_get
SELECT * FROM rq_jobs WHERE id = :job_id;

-- name: job_lease_candidates
-- Ready jobs by priority, then run_at, then id. A job with an ordering key is a
-- candidate only when it is the oldest unfinished job of its key (per-key FIFO,
-- at most one running per key).
SELECT j.id, j.job_type
FROM rq_jobs AS j
WHERE j.state = 'queued'
  AND j.run_at <= :now
  AND (:queues IS NULL OR j.queue IN (SELECT value FROM json_each(:queues)))
  AND (:job_types IS NULL OR j.job_type IN (SELECT value FROM json_each(:job_types)))
  AND (:skip_ids IS NULL OR j.id NOT IN (SELECT value FROM json_each(:skip_ids)))
  AND (j.ordering_key IS NULL OR (
        j.id = (
          SELECT MIN(k.id) FROM rq_jobs AS k
          WHERE k.ordering_key = j.ordering_key AND k.state IN ('queued', 'running'))
        -- A requeued dead job can be older than the running one: never two at once.
        AND NOT EXISTS (
          SELECT 1 FROM rq_jobs AS r
          WHERE r.ordering_key = j.ordering_key AND r.state = 'running')))
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT :limit;

-- name: job_lease_many
-- Claims the chosen candidates in one statement: the caller puts one row per job, (job id,
-- lease seconds, handler version), in place of (:rows) (SqliteTransaction.rows_query:
-- bound values, no JSON to write and parse per job). Leases are granted, extended and
-- reaped in :lease_now, or when it is NULL in SQLite's own now: the host's clock, which
-- every process on the file shares (julianday('now') is one value for the whole
-- statement, to the millisecond; unixepoch('subsec') needs 3.42). The rows are a
-- subquery (columns column1..3), not a WITH: a WITH cost each batch a materialized table.
UPDATE rq_jobs
SET state = 'running', attempt = attempt + 1, owner_token = :owner_token,
    worker_id = :worker_id,
    leased_at = COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0),
    lease_deadline = COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0)
        + c.column2,
    -- A job keeps the version of its first lease through every later attempt.
    handler_version = COALESCE(handler_version, c.column3),
    hlc = MAX(hlc + 1, :hlc)
FROM (VALUES (:rows)) AS c
WHERE rq_jobs.id = c.column1 AND rq_jobs.state = 'queued'
RETURNING *;

-- name: lease_check
-- Fencing: does this owner token still hold the job's lease? Called inside every
-- transaction that writes for a job; SQLite's write transactions are BEGIN IMMEDIATE,
-- so no reaper can take the job between this read and the commit.
SELECT id FROM rq_jobs
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: leases_extend
-- A worker's heartbeat: every lease in :rows (a JSON array of [job id, owner token,
-- lease seconds]) in one statement, each row compared with its own token and given its
-- own seconds; RETURNING names the leases still held.
UPDATE rq_jobs
SET lease_deadline = COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0)
    + (SELECT json_extract(l.value, '$[2]') FROM json_each(:rows) AS l
       WHERE json_extract(l.value, '$[0]') = rq_jobs.id)
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(:rows))
  AND state = 'running'
  AND owner_token = (SELECT json_extract(l.value, '$[1]') FROM json_each(:rows) AS l
                     WHERE json_extract(l.value, '$[0]') = rq_jobs.id)
RETURNING id;

-- name: jobs_complete
-- A group commit's acks in one statement: the caller puts one row per ack, (job id,
-- owner token, result, hlc), in place of (:rows) (bound values, as job_lease_many's:
-- columns column1..4); RETURNING names the jobs whose lease was still held (and their
-- ordering keys: an ack can make the next job of its key ready).
UPDATE rq_jobs
SET state = 'succeeded', result = c.column3, finished_at = :now,
    owner_token = NULL, lease_deadline = NULL, hlc = c.column4
FROM (VALUES (:rows)) AS c
WHERE rq_jobs.id = c.column1
  AND rq_jobs.owner_token = c.column2 AND rq_jobs.state = 'running'
RETURNING rq_jobs.id, rq_jobs.ordering_key;

-- name: jobs_complete_counted
-- jobs_complete without RETURNING, which builds a temporary table for each group
-- (SqliteTransaction.jobs_complete), for a caller that knows the jobs' ordering keys: the
-- rows changed are counted (the cursor's rowcount), and all or none of the group's acks
-- held says which. Otherwise jobs_completed_by names them.
UPDATE rq_jobs
SET state = 'succeeded', result = c.column3, finished_at = :now,
    owner_token = NULL, lease_deadline = NULL, hlc = c.column4
FROM (VALUES (:rows)) AS c
WHERE rq_jobs.id = c.column1 AND rq_jobs.state = 'running'
  AND rq_jobs.owner_token = c.column2;

-- name: jobs_completed_by
-- After jobs_complete_counted changed some of a group's rows but not all (a lease lost):
-- the rows (job id, hlc) as that statement left them. Each row it changed is here; a row
-- it did not change is here only if another ack gave it the same hlc and finish time.
SELECT rq_jobs.id
FROM rq_jobs, (VALUES (:rows)) AS c
WHERE rq_jobs.id = c.column1 AND rq_jobs.hlc = c.column2
  AND rq_jobs.state = 'succeeded' AND rq_jobs.owner_token IS NULL
  AND rq_jobs.finished_at = :now;

-- name: job_retry
UPDATE rq_jobs
SET state = 'queued', run_at = :run_at, last_error_class = :error_class, last_error = :error,
    owner_token = NULL, lease_deadline = NULL, hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: job_bury_owned
UPDATE rq_jobs
SET state = 'dead', dead_reason = :reason, last_error_class = :error_class, last_error = :error,
    finished_at = :now, owner_token = NULL, lease_deadline = NULL, hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: job_bury_queued
UPDATE rq_jobs
SET state = 'dead', dead_reason = :reason, last_error_class = :error_class, last_error = :error,
    finished_at = :now, hlc = :hlc
WHERE id = :job_id AND state = 'queued';

-- name: job_cancel
UPDATE rq_jobs
SET state = 'cancelled', finished_at = :now, owner_token = NULL, lease_deadline = NULL,
    hlc = :hlc
WHERE id = :job_id AND state = 'queued';

-- name: job_cancel_request
-- A running job is asked to stop; it is cancelled by its worker (or the reaper).
UPDATE rq_jobs SET cancel_requested_at = :now, hlc = :hlc
WHERE id = :job_id AND state = 'running' AND cancel_requested_at IS NULL;

-- name: job_cancel_requested
-- The worker's heartbeat: which of its running jobs were asked to stop.
SELECT * FROM rq_jobs
WHERE worker_id = :worker_id AND state = 'running' AND cancel_requested_at IS NOT NULL;

-- name: job_cancel_running
-- The attempt that was asked to stop ends cancelled (a compare-and-set on the owner).
UPDATE rq_jobs
SET state = 'cancelled', finished_at = :now, owner_token = NULL, lease_deadline = NULL,
    hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running'
  AND cancel_requested_at IS NOT NULL;

-- name: job_release_running
-- The attempt asked to be released (rollout rollback --release-inflight) goes back to the
-- queue on the version named, its attempt number kept and one more in its budget.
UPDATE rq_jobs
SET state = 'queued', run_at = :now, max_attempts = max_attempts + 1, owner_token = NULL,
    lease_deadline = NULL, cancel_requested_at = NULL, handler_version = :to_version,
    hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running'
  AND cancel_requested_at IS NOT NULL;

-- name: job_requeue
UPDATE rq_jobs
SET state = 'queued', run_at = :now, max_attempts = attempt + :extra_attempts,
    dead_reason = NULL, finished_at = NULL, hlc = :hlc,
    -- A requeued job is routed afresh at its next lease unless a version is named.
    handler_version = :to_version
WHERE id = :job_id AND state = 'dead';

-- name: lease_reap
SELECT * FROM rq_jobs
WHERE state = 'running'
  AND lease_deadline < COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY lease_deadline
LIMIT :limit;

-- name: job_redeliver
UPDATE rq_jobs
SET state = 'queued', run_at = :now, owner_token = NULL, lease_deadline = NULL,
    redelivery_count = redelivery_count + 1, hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: lease_release
-- Shutdown: the job goes back with one more attempt in its budget; its attempt number
-- is kept, so the next run's events and outbox ids never collide with this one's.
UPDATE rq_jobs
SET state = 'queued', run_at = :now, max_attempts = max_attempts + 1, owner_token = NULL,
    lease_deadline = NULL, hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: lease_return
-- A job leased ahead and never started goes back as if never leased: the attempt its
-- lease counted is taken back, its budget and run_at (its place in the queue) kept.
UPDATE rq_jobs
SET state = 'queued', attempt = attempt - 1, owner_token = NULL, lease_deadline = NULL,
    hlc = :hlc
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: job_list
SELECT * FROM rq_jobs
WHERE (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:job_type IS NULL OR job_type = :job_type)
  AND (:origin IS NULL OR origin = :origin)
  AND (:version IS NULL OR handler_version = :version)
  AND id < :before  -- a bound, never NULL: the scan starts at it (a rowid seek)
ORDER BY id DESC
LIMIT :limit;

-- name: job_count
-- The number of jobs job_list would page through with the same filters.
SELECT count(*) AS count FROM rq_jobs
WHERE (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:job_type IS NULL OR job_type = :job_type)
  AND (:origin IS NULL OR origin = :origin)
  AND (:version IS NULL OR handler_version = :version);

-- name: job_list_by_state
-- job_list when :states is given and does not name 'succeeded' (the caller picks it): each
-- state is read from the partial index it lives in (rq_jobs_ready, rq_jobs_lease_deadline,
-- rq_jobs_failed), never from the history of succeeded jobs, so `jobs list --state dead`
-- costs the same at a million finished jobs as at none. A branch whose state is not
-- asked for is skipped before it reads a row (its state test does not depend on the row).
SELECT * FROM (
    SELECT * FROM (
        SELECT * FROM rq_jobs INDEXED BY rq_jobs_ready
        WHERE state = 'queued' AND 'queued' IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version)
        AND id < :before
        ORDER BY id DESC LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT * FROM rq_jobs INDEXED BY rq_jobs_lease_deadline
        WHERE state = 'running' AND 'running' IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version)
        AND id < :before
        ORDER BY id DESC LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT * FROM rq_jobs INDEXED BY rq_jobs_failed
        WHERE state IN ('dead', 'cancelled') AND state IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version)
        AND id < :before
        ORDER BY id DESC LIMIT :limit))
ORDER BY id DESC
LIMIT :limit;

-- name: job_count_by_state
-- job_count for the states job_list_by_state reads, from the same partial indexes.
SELECT (SELECT count(*) FROM rq_jobs INDEXED BY rq_jobs_ready
        WHERE state = 'queued' AND 'queued' IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version))
     + (SELECT count(*) FROM rq_jobs INDEXED BY rq_jobs_lease_deadline
        WHERE state = 'running' AND 'running' IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version))
     + (SELECT count(*) FROM rq_jobs INDEXED BY rq_jobs_failed
        WHERE state IN ('dead', 'cancelled') AND state IN (SELECT value FROM json_each(:states))
        AND (:job_type IS NULL OR job_type = :job_type)
        AND (:origin IS NULL OR origin = :origin)
        AND (:version IS NULL OR handler_version = :version)) AS count;

-- name: job_match
-- Bulk actions: the ids of production jobs matching every given filter, oldest first.
-- The window is on when a job settled (finished, died, was cancelled), or, while it
-- is open, when it was enqueued.
SELECT id FROM rq_jobs
WHERE origin = 'production'
  AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:job_type IS NULL OR job_type = :job_type)
  AND (:version IS NULL OR handler_version = :version)
  AND (:queue IS NULL OR queue = :queue)
  AND (:error_class IS NULL OR last_error_class = :error_class)
  AND (:since IS NULL OR COALESCE(finished_at, created_at) >= :since)
  AND (:until IS NULL OR COALESCE(finished_at, created_at) < :until)
ORDER BY id
LIMIT :limit;

-- name: job_stats
SELECT job_type, state, COUNT(*) AS count, MIN(run_at) AS oldest_run_at
FROM rq_jobs
WHERE origin = 'production'
GROUP BY job_type, state
ORDER BY job_type, state;

-- name: job_gauges
-- The fleet's gauges (replayq metrics serve): open jobs by queue, type, version and state,
-- with the oldest ready job's run_at and the oldest lease start of running ones.
SELECT queue, job_type, COALESCE(handler_version, '') AS version, state, COUNT(*) AS count,
       MIN(CASE WHEN state = 'queued' AND run_at <= :now THEN run_at END) AS oldest_ready,
       MIN(CASE WHEN state = 'running' THEN leased_at END) AS oldest_leased
FROM rq_jobs
WHERE origin = 'production' AND state IN ('queued', 'running', 'dead')
GROUP BY queue, job_type, COALESCE(handler_version, ''), state
ORDER BY queue, job_type, version, state;

-- name: job_out_of_order
-- Jobs with an ordering key leased (or waiting) after an earlier job of the same key
-- died or was cancelled: per-key order is broken for them ("cancel before create").
-- Cancelled later jobs never ran and do not count. By queue, type and version.
WITH broken AS (
    SELECT ordering_key, MIN(id) AS first_id FROM rq_jobs
    WHERE ordering_key IS NOT NULL AND origin = 'production'
      AND state IN ('dead', 'cancelled')
    GROUP BY ordering_key)
SELECT j.queue AS queue, j.job_type AS job_type,
       COALESCE(j.handler_version, '') AS version, COUNT(*) AS count
FROM rq_jobs AS j
JOIN broken AS b ON b.ordering_key = j.ordering_key AND j.id > b.first_id
WHERE j.origin = 'production' AND j.state <> 'cancelled'
GROUP BY j.queue, j.job_type, COALESCE(j.handler_version, '');

-- name: job_durations
-- rq_pack_events: none of these names is a job.enqueued (rq_enqueued_events).
SELECT json_extract(e.data, '$.duration') AS duration
FROM rq_pack_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id
WHERE e.name IN ('job.succeeded', 'job.failed', 'job.write_rejected')
  AND j.job_type = :job_type
  AND (:version IS NULL OR json_extract(e.data, '$.version') = :version)
  AND j.origin = 'production';

-- name: trace_append
-- One pack: the events of one commit of one job attempt or derived trace (storage/packs.py).
-- Its id is the cursor's lastrowid, as job_insert's.
INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
VALUES (:trace_id, :job_id, :attempt, :worker_id, :hlc, :hlc_last, :ts, :events);

-- name: trace_append_rows
-- Many packs in one statement (enqueue: each new job's first pack). The caller puts
-- one "(?, ?, ?, ?, ?, ?, ?, ?)" per pack, in these columns' order, in place of (:rows).
-- The new ids are the cursor's lastrowid and the ones below it, one per row (no
-- RETURNING: SqliteTransaction.rows_inserted_ids).
INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
VALUES (:rows);

-- name: trace_append_fenced
-- trace_append under a fence: the pack goes in only while the owner token holds the
-- job's lease (lease_check folded into the insert, so a step's commit costs no extra
-- statement). No row back: the lease is gone and the caller rolls back.
INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
SELECT :trace_id, :job_id, :attempt, :worker_id, :hlc, :hlc_last, :ts, :events
WHERE EXISTS (SELECT 1 FROM rq_jobs
              WHERE id = :fence_job_id AND owner_token = :fence_owner_token
                AND state = 'running')
RETURNING id;

-- name: trace_extend
-- More events of a JSON text pack (format 1), the pack rewritten whole. SQLite writes
-- formats 2 to 4 and joins packs with trace_join and trace_rewrite; this stays for the
-- shared code's sake.
UPDATE rq_trace SET hlc = :hlc, hlc_last = :hlc_last, ts = :ts, events = :events
WHERE id = :id AND trace_id = :trace_id AND job_id IS :job_id AND attempt IS :attempt;

-- name: trace_join
-- More events of the pack written last on this connection, in this transaction or a
-- committed one before it: their piece of the pack's deflate stream appended to the
-- stored bytes (storage/packs.py, PackWriter), the events already stored not written
-- again. Only while the row holds exactly what its writer wrote (:stored): a pack rolled
-- back or rewritten since is left alone, and the group's fields are checked too (a pack
-- id is never taken for another attempt's pack). || gives text: cast back to a blob.
UPDATE rq_trace
SET hlc_last = max(hlc_last, :hlc_last), events = CAST(events || :piece AS BLOB)
WHERE id = :id AND events = :stored
  AND trace_id = :trace_id AND job_id IS :job_id AND attempt IS :attempt;

-- name: trace_join_fenced
-- trace_join under a fence: the piece is appended only while the owner token holds the
-- job's lease (lease_check folded into the update, as trace_append_fenced folds it into
-- the insert). No row changed: the lease is gone or the pack is not as written; the
-- caller asks lease_check which (only then).
UPDATE rq_trace
SET hlc_last = max(hlc_last, :hlc_last), events = CAST(events || :piece AS BLOB)
WHERE id = :id AND events = :stored
  AND trace_id = :trace_id AND job_id IS :job_id AND attempt IS :attempt
  AND EXISTS (SELECT 1 FROM rq_jobs AS fence
              WHERE fence.id = :fence_job_id AND fence.owner_token = :fence_owner_token
                AND fence.state = 'running');

-- name: trace_rewrite
-- More events of a pack of one lifecycle event (format 3 or 4, storage/lifecycle_packs.py;
-- storage/packs.py's CompactPack): it has no deflate stream to append to, so the pack is
-- rewritten whole as format 2 (:events), its event's item and the new ones in one stream
-- that later joins append to (trace_join). As trace_join, only while the row holds
-- exactly what was written (:stored), and the group's fields are checked too.
UPDATE rq_trace
SET hlc_last = max(hlc_last, :hlc_last), events = :events
WHERE id = :id AND events = :stored
  AND trace_id = :trace_id AND job_id IS :job_id AND attempt IS :attempt;

-- name: trace_rewrite_fenced
-- trace_rewrite under a fence, as trace_join_fenced: the lease check folded into the update.
UPDATE rq_trace
SET hlc_last = max(hlc_last, :hlc_last), events = :events
WHERE id = :id AND events = :stored
  AND trace_id = :trace_id AND job_id IS :job_id AND attempt IS :attempt
  AND EXISTS (SELECT 1 FROM rq_jobs AS fence
              WHERE fence.id = :fence_job_id AND fence.owner_token = :fence_owner_token
                AND fence.state = 'running');

-- name: trace_resources_append
INSERT OR IGNORE INTO rq_trace_resources (resource, hlc, pack_id) VALUES (:resource, :hlc, :pack_id);

-- name: trace_for_job
-- rq_packs: rq_trace_job, and the job's row for its job.enqueued pack (migration 0023);
-- the caller sorts the unpacked events by (hlc, id).
SELECT * FROM rq_packs WHERE job_id = :job_id ORDER BY id;

-- name: trace_for_jobs
-- trace_for_job for a list of jobs (JSON array): rq_trace_job once per job, and the jobs'
-- rows for their job.enqueued packs (an IN is not pushed into the view rq_packs: written
-- out); the caller groups the rows by job and sorts each job's unpacked events by (hlc, id).
SELECT * FROM rq_trace WHERE job_id IN (SELECT value FROM json_each(:job_ids))
UNION ALL
SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs
WHERE id IN (SELECT value FROM json_each(:job_ids)) AND enqueued_hlc IS NOT NULL;

-- name: trace_for_jobs_attempts
-- trace_for_jobs without the jobs' job.enqueued packs (attempt 0, in their rq_jobs rows):
-- what a replay reads of a recording (its attempt's events), one rq_trace_job lookup a job.
SELECT * FROM rq_trace WHERE job_id IN (SELECT value FROM json_each(:job_ids));

-- name: trace_for_trace
-- A derived trace's packs (rq_trace_derived), or a job's by its trace id (rq_jobs_trace,
-- then rq_trace_job, and the job's row for its job.enqueued pack).
SELECT * FROM rq_trace WHERE trace_id = :trace_id AND job_id IS NULL
UNION ALL
SELECT * FROM rq_trace
WHERE job_id IN (SELECT id FROM rq_jobs WHERE trace_id = :trace_id) AND trace_id = :trace_id
UNION ALL
SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs WHERE trace_id = :trace_id AND enqueued_hlc IS NOT NULL;

-- name: trace_for_resource
-- The packs naming the resource or one of its versioned keys (a cache key ``price:sku-1``
-- written as ``price:sku-1:v3``): both terms are ranges on rq_trace_resources' key (a
-- prefix as [':v', ':w') in byte order). The caller keeps the events that name them.
SELECT * FROM rq_trace
WHERE id IN (SELECT pack_id FROM rq_trace_resources
             WHERE resource = :resource
                OR (resource >= :resource || ':v' AND resource < :resource || ':w'));

-- name: contract_put
INSERT INTO rq_contracts (job_type, version, body, registered_at)
VALUES (:job_type, :version, :body, :now)
ON CONFLICT (job_type, version) DO UPDATE SET body = excluded.body;

-- name: contract_list
SELECT job_type, version, body, registered_at FROM rq_contracts
WHERE (:job_type IS NULL OR job_type = :job_type)
  AND (:version IS NULL OR version = :version)
ORDER BY job_type, registered_at, version;

-- name: contract_activate
INSERT INTO rq_active_versions (job_type, version, registered_at)
VALUES (:job_type, :version, :now)
ON CONFLICT (job_type) DO UPDATE SET version = excluded.version,
                                     registered_at = excluded.registered_at;

-- name: contract_active
SELECT version FROM rq_active_versions WHERE job_type = :job_type;

-- name: migrations_create
CREATE TABLE IF NOT EXISTS rq_schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
);

-- name: migrations_table_exists
SELECT COUNT(*) AS present FROM sqlite_master
WHERE type = 'table' AND name = 'rq_schema_migrations';

-- name: migrations_applied
SELECT version, name, applied_at FROM rq_schema_migrations ORDER BY version;

-- name: migration_record
INSERT INTO rq_schema_migrations (version, name, applied_at) VALUES (:version, :name, :now);

-- name: job_set_recorded
-- Importing a regression case: the job as it was recorded.
UPDATE rq_jobs SET handler_version = :handler_version, result = :result_json, attempt = :attempt,
    state = 'succeeded'
WHERE id = :job_id;

-- name: signal_counts
-- Incident signals per job type, counted from the trace (production jobs only).
-- rq_pack_events: no signal (replay/signals.py) is a job.enqueued (rq_enqueued_events).
SELECT j.job_type AS job_type, e.name AS name, COUNT(*) AS count
FROM rq_pack_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id
WHERE e.name IN (SELECT value FROM json_each(:names))
  AND j.origin = 'production'
  AND e.ts >= :since
GROUP BY j.job_type, e.name
ORDER BY j.job_type, e.name;

-- name: job_scheduled
-- Queued jobs not yet due (delayed, or waiting out a retry's backoff): how many, and
-- when the first one is due. A burst worker waits for them or says why it left.
SELECT COUNT(*) AS count, MIN(run_at) AS next_run_at
FROM rq_jobs
WHERE state = 'queued'
  AND run_at > :now
  AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)));
