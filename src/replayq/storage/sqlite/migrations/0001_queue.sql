-- 0001 queue: jobs, lifecycle trace, stored contracts.
-- Times are seconds since the epoch (REAL); "now" always comes from the caller's Clock.

CREATE TABLE rq_jobs (
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
    message_id       TEXT    UNIQUE,
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
    origin           TEXT    NOT NULL DEFAULT 'production'
);

CREATE INDEX rq_jobs_ready ON rq_jobs (priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX rq_jobs_lease_deadline ON rq_jobs (lease_deadline) WHERE state = 'running';
CREATE INDEX rq_jobs_ordering ON rq_jobs (ordering_key, id)
    WHERE state IN ('queued', 'running') AND ordering_key IS NOT NULL;
-- On job_type alone: a job's type never changes, so no state change touches this
-- index (job_durations finds a type's jobs here; stats scans the table anyway).
CREATE INDEX rq_jobs_type ON rq_jobs (job_type);
CREATE INDEX rq_jobs_trace ON rq_jobs (trace_id);

-- No AUTOINCREMENT: events are append-only and never deleted out of order, and
-- AUTOINCREMENT would update sqlite_sequence on every commit (an extra page).
CREATE TABLE rq_events (
    id               INTEGER PRIMARY KEY,
    trace_id         TEXT    NOT NULL,
    job_id           INTEGER,
    attempt          INTEGER,
    kind             TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    seq              INTEGER,
    step             TEXT,
    ts               REAL    NOT NULL,
    hlc              INTEGER NOT NULL,
    worker_id        TEXT,
    status           TEXT,
    resource         TEXT,
    resource_version INTEGER,
    side_effect      INTEGER NOT NULL DEFAULT 0,
    input_ref        TEXT,
    output_ref       TEXT,
    data             TEXT    NOT NULL DEFAULT '{}'
);

CREATE INDEX rq_events_job ON rq_events (job_id, id);
CREATE INDEX rq_events_trace ON rq_events (trace_id, id);
CREATE INDEX rq_events_resource ON rq_events (resource, hlc) WHERE resource IS NOT NULL;
-- No index on name: every lifecycle commit would dirty it; the one query that
-- filters on name (job_durations) reaches events through rq_jobs_type + rq_events_job.

CREATE TABLE rq_contracts (
    job_type      TEXT NOT NULL,
    version       TEXT NOT NULL,
    body          TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (job_type, version)
);
