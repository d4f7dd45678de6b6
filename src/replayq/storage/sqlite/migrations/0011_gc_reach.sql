-- 0011 gc: holds of live forks and dry-runs, blobs collected by reachability, derived
-- traces collected by age.

-- A fork, dry-run or verification in progress holds the job it runs from: gc neither trims
-- nor deletes a held job, nor collects the derived traces of it, until the holder releases
-- the hold (at its end) or the hold expires (a holder that died).
CREATE TABLE rq_gc_holds (
    holder     TEXT    PRIMARY KEY,
    job_id     INTEGER NOT NULL,
    expires_at REAL    NOT NULL
);

CREATE INDEX rq_gc_holds_job ON rq_gc_holds (job_id);

-- When a blob was last stored: storing a value whose blob exists already touches it, so gc
-- (which collects only blobs nobody stored within its grace period) never removes a blob
-- that a commit in flight is about to reference.
ALTER TABLE rq_blobs ADD COLUMN used_at REAL NOT NULL DEFAULT 0;

UPDATE rq_blobs SET used_at = created_at;

-- gc's scan of derived traces (replays, forks, verifications) by age.
CREATE INDEX rq_lineage_created ON rq_lineage (created_at);

-- Message-id dedup per job type: the same message id enqueued for two job types makes two
-- jobs (it was unique across every type). SQLite cannot drop a column's UNIQUE constraint,
-- so rq_jobs is rebuilt without it (the same columns, rows, ids and indexes; the id
-- sequence is carried over so a deleted job's id is never reused).
CREATE TABLE rq_jobs_0011 (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
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

INSERT INTO rq_jobs_0011 (
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

INSERT INTO sqlite_sequence (name, seq)
SELECT 'rq_jobs_0011', seq FROM sqlite_sequence WHERE name = 'rq_jobs';

DROP TABLE rq_jobs;

-- The rename in legacy mode, as in 0022: SQLite's own checks every view and trigger of
-- the schema first, and a view of the file's owner over rq_jobs (dropped just above)
-- refused the whole upgrade. Legacy mode renames the table alone; such views name
-- rq_jobs, which the copy is again. (Added after 0022; the tables it leaves are
-- the same, so a file that had this migration applied already is as it would be.)
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_jobs_0011 RENAME TO rq_jobs;

PRAGMA legacy_alter_table = OFF;

CREATE INDEX rq_jobs_ready ON rq_jobs (priority DESC, run_at, id) WHERE state = 'queued';

CREATE INDEX rq_jobs_lease_deadline ON rq_jobs (lease_deadline) WHERE state = 'running';

CREATE INDEX rq_jobs_ordering ON rq_jobs (ordering_key, id)
    WHERE state IN ('queued', 'running') AND ordering_key IS NOT NULL;

CREATE INDEX rq_jobs_type ON rq_jobs (job_type);

CREATE INDEX rq_jobs_trace ON rq_jobs (trace_id);

CREATE INDEX rq_jobs_finished ON rq_jobs (finished_at) WHERE finished_at IS NOT NULL;

CREATE UNIQUE INDEX rq_jobs_message ON rq_jobs (job_type, message_id);
