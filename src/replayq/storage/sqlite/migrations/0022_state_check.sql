-- 0022 rq_jobs' state CHECK as comparisons, not an IN list.
--
-- SQLite codes a CHECK's IN list of more than two constants as a temporary index, built
-- again (cleared, its five values inserted, then searched) for every row an INSERT or an
-- UPDATE of state writes: a drained job's lease and ack paid it once each, ~19,000
-- instructions a row (SQLite 3.40.1, callgrind). The same condition as ORed
-- comparisons is evaluated in place. It accepts exactly the same values (a NULL state
-- is refused by NOT NULL either way), so every row the old CHECK took, this one takes.
-- A CHECK cannot be altered: the table is copied, as 0017 did (the same columns, rows,
-- ids, indexes and triggers). The copy fires no trigger (rq_jobs_enqueued is on the old
-- table, dropped with it, and created again below).
CREATE TABLE rq_jobs_0022 (
    id               INTEGER PRIMARY KEY,
    job_type         TEXT    NOT NULL,
    queue            TEXT    NOT NULL DEFAULT 'default',
    payload          TEXT    NOT NULL,
    state            TEXT    NOT NULL
                     CHECK (state = 'queued' OR state = 'running' OR state = 'succeeded'
                            OR state = 'dead' OR state = 'cancelled'),
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

INSERT INTO rq_jobs_0022 (
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

-- The rename in legacy mode: SQLite's own (3.26 on) checks every view and trigger of the
-- schema first, and one of the file's owner over rq_jobs (dropped just above) refused the
-- whole upgrade ("error in view ...: no such table: main.rq_jobs"). Legacy mode renames
-- the table alone; such views and triggers name rq_jobs, which the copy is again.
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_jobs_0022 RENAME TO rq_jobs;

PRAGMA legacy_alter_table = OFF;

CREATE INDEX rq_jobs_ready ON rq_jobs (priority DESC, run_at, id) WHERE state = 'queued';

CREATE INDEX rq_jobs_lease_deadline ON rq_jobs (lease_deadline) WHERE state = 'running';

CREATE INDEX rq_jobs_ordering ON rq_jobs (ordering_key, id)
    WHERE state IN ('queued', 'running') AND ordering_key IS NOT NULL;

CREATE INDEX rq_jobs_trace ON rq_jobs (trace_id);

CREATE UNIQUE INDEX rq_jobs_message ON rq_jobs (job_type, message_id);

CREATE INDEX rq_jobs_failed ON rq_jobs (state, id) WHERE state IN ('dead', 'cancelled');

-- A delete that removes the newest job raises the floor to its id (migration 0017).
CREATE TRIGGER rq_jobs_id_floor AFTER DELETE ON rq_jobs
WHEN OLD.id > COALESCE((SELECT MAX(id) FROM rq_jobs), 0)
BEGIN
    INSERT INTO rq_gc (name, cursor, updated_at)
    VALUES ('job_id_floor', OLD.id, (julianday('now') - 2440587.5) * 86400.0)
    ON CONFLICT (name) DO UPDATE SET cursor = MAX(cursor, excluded.cursor),
                                     updated_at = excluded.updated_at;
END;

-- A new job's job.enqueued pack, written by the insert of its row (migration 0020).
CREATE TRIGGER rq_jobs_enqueued AFTER INSERT ON rq_jobs
BEGIN
    INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
    VALUES (NEW.trace_id, NEW.id, 0, NULL, NEW.hlc, NEW.hlc, NEW.created_at,
            CAST(x'03' || '[' || rtrim(
                printf('%!.17g', NEW.run_at) || ',' || NEW.priority
                || ',' || json_quote(NEW.message_id)
                || ',' || json_quote(NEW.ordering_key)
                || ',' || json_quote(NEW.causation_id), ',nul') || ']' AS BLOB));
END;
