-- 0017 job ids without AUTOINCREMENT: one page less per enqueue, ids still never reused.
--
-- AUTOINCREMENT kept a job id from ever being given twice (a reused id would attach a new
-- job to a deleted one's state versions, lineage and external references), at the price
-- of a write to sqlite_sequence in every transaction that inserts a job: one more WAL page
-- per enqueue, about 1 in 9 (docs/benchmarks.md). Without it SQLite gives max(id) + 1,
-- which repeats an id only after the job holding the highest id was deleted. So the
-- highest id ever deleted while it was the highest is kept as a floor, the row
-- 'job_id_floor' of rq_gc (gc's bookkeeping; only gc deletes jobs): job_insert takes
-- floor + 1 when the floor is not below max(id), and the trigger below raises the floor
-- whenever a delete (gc's, or anyone's) removes the newest job. An enqueue reads the floor
-- (a seek, no write); the trigger writes only when the newest job goes.
--
-- The floor starts at what AUTOINCREMENT had given, when that is above every job left.
INSERT INTO rq_gc (name, cursor, updated_at)
SELECT 'job_id_floor', seq, (julianday('now') - 2440587.5) * 86400.0
FROM sqlite_sequence
WHERE name = 'rq_jobs' AND seq > COALESCE((SELECT MAX(id) FROM rq_jobs), 0);

-- The same columns, rows, ids and indexes; only the key's AUTOINCREMENT goes.
CREATE TABLE rq_jobs_0017 (
    id               INTEGER PRIMARY KEY,
    job_type         TEXT    NOT NULL,
    queue            TEXT    NOT NULL DEFAULT 'default',
    payload          TEXT    NOT NULL,
    state            TEXT    NOT NULL
                     CHECK (state IN ('queued', 'running', 'succeeded', 'dead', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           REAL    NOT NULL,
    created_at       REAL    NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    trace_id         TEXT    NOT NULL,
    message_id       TEXT,
    ordering_key     TEXT,
    idempotency_key  TEXT,
    handler_version  TEXT,
    owner_token      TEXT,
    worker_id        TEXT,
    leased_at        REAL,
    lease_deadline   REAL,
    redelivery_count INTEGER NOT NULL DEFAULT 0,
    last_error_class TEXT,
    last_error       TEXT,
    dead_reason      TEXT,
    result           TEXT,
    finished_at      REAL,
    hlc              INTEGER NOT NULL DEFAULT 0,
    correlation_id   TEXT,
    causation_id     TEXT,
    origin           TEXT    NOT NULL DEFAULT 'production',
    trace_context    TEXT,
    cancel_requested_at REAL
);

INSERT INTO rq_jobs_0017 (
    id, job_type, queue, payload, state, priority, run_at, created_at, attempt, max_attempts,
    trace_id, message_id, ordering_key, idempotency_key, handler_version, owner_token,
    worker_id, leased_at, lease_deadline, redelivery_count, last_error_class, last_error,
    dead_reason, result, finished_at, hlc, correlation_id, causation_id, origin,
    trace_context, cancel_requested_at)
SELECT
    id, job_type, queue, payload, state, priority, run_at, created_at, attempt, max_attempts,
    trace_id, message_id, ordering_key, idempotency_key, handler_version, owner_token,
    worker_id, leased_at, lease_deadline, redelivery_count, last_error_class, last_error,
    dead_reason, result, finished_at, hlc, correlation_id, causation_id, origin,
    trace_context, cancel_requested_at
FROM rq_jobs;

DROP TABLE rq_jobs;

-- The rename in legacy mode, as in 0022: SQLite's own checks every view and trigger of
-- the schema first, and a view of the file's owner over rq_jobs (dropped just above)
-- refused the whole upgrade. Legacy mode renames the table alone; such views name
-- rq_jobs, which the copy is again. (Added after 0022; the tables it leaves are
-- the same, so a file that had this migration applied already is as it would be.)
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_jobs_0017 RENAME TO rq_jobs;

PRAGMA legacy_alter_table = OFF;

CREATE INDEX rq_jobs_ready ON rq_jobs (priority DESC, run_at, id) WHERE state = 'queued';

CREATE INDEX rq_jobs_lease_deadline ON rq_jobs (lease_deadline) WHERE state = 'running';

CREATE INDEX rq_jobs_ordering ON rq_jobs (ordering_key, id)
    WHERE state IN ('queued', 'running') AND ordering_key IS NOT NULL;

CREATE INDEX rq_jobs_trace ON rq_jobs (trace_id);

CREATE UNIQUE INDEX rq_jobs_message ON rq_jobs (job_type, message_id);

CREATE INDEX rq_jobs_failed ON rq_jobs (state, id) WHERE state IN ('dead', 'cancelled');

-- A delete that removes the newest job raises the floor to its id (jobs are deleted by
-- gc's jobs_delete, oldest first, so this fires only when gc reaches the newest job).
CREATE TRIGGER rq_jobs_id_floor AFTER DELETE ON rq_jobs
WHEN OLD.id > COALESCE((SELECT MAX(id) FROM rq_jobs), 0)
BEGIN
    INSERT INTO rq_gc (name, cursor, updated_at)
    VALUES ('job_id_floor', OLD.id, (julianday('now') - 2440587.5) * 86400.0)
    ON CONFLICT (name) DO UPDATE SET cursor = MAX(cursor, excluded.cursor),
                                     updated_at = excluded.updated_at;
END;
