-- The canonical SQLite schema: what applying every migration in migrations/ produces.
-- Not executed by replayq; tests/migration/test_schema.py checks it against the migrations.
-- Regenerate after adding a migration: .venv/bin/python -m tests.migration.test_schema

CREATE TABLE rq_schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
);

CREATE TABLE rq_contracts (
    job_type      TEXT NOT NULL,
    version       TEXT NOT NULL,
    body          TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (job_type, version)
);

CREATE TABLE rq_entity_versions (
    branch         TEXT    NOT NULL,
    namespace      TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    parent_version INTEGER,
    data           TEXT,
    data_ref       TEXT,
    delta          TEXT    NOT NULL,
    job_id         INTEGER,
    trace_id       TEXT,
    attempt        INTEGER,
    fencing_token  INTEGER,
    created_at     REAL    NOT NULL,
    hlc            INTEGER NOT NULL,
    PRIMARY KEY (branch, namespace, key, version)
);

CREATE INDEX rq_entity_versions_job ON rq_entity_versions (job_id);

CREATE TABLE rq_branches (
    branch      TEXT    PRIMARY KEY,
    base_branch TEXT    NOT NULL,
    base_hlc    INTEGER NOT NULL,
    origin      TEXT    NOT NULL,
    created_at  REAL    NOT NULL
);

CREATE TABLE rq_locks (
    resource      TEXT    PRIMARY KEY,
    owner_token   TEXT,
    fencing_token INTEGER NOT NULL,
    job_id        INTEGER,
    worker_id     TEXT,
    acquired_at   REAL,
    expires_at    REAL,
    hlc           INTEGER NOT NULL
);

CREATE TABLE rq_cache (
    key              TEXT    PRIMARY KEY,
    base_key         TEXT    NOT NULL,
    value            TEXT    NOT NULL,
    version          INTEGER,
    source_namespace TEXT,
    source_key       TEXT,
    written_at       REAL    NOT NULL,
    expires_at       REAL
);

CREATE INDEX rq_cache_base ON rq_cache (base_key, written_at);

CREATE TABLE rq_outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT    NOT NULL UNIQUE,
    topic         TEXT    NOT NULL,
    payload       TEXT    NOT NULL,
    job_id        INTEGER,
    trace_id      TEXT,
    created_at    REAL    NOT NULL,
    claimed_until REAL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    published_at  REAL,
    last_error    TEXT
);

CREATE INDEX rq_outbox_pending ON rq_outbox (id) WHERE published_at IS NULL;

CREATE TABLE rq_lineage (
    trace_id        TEXT PRIMARY KEY,
    origin          TEXT NOT NULL,
    source_trace_id TEXT NOT NULL,
    source_job_id   INTEGER,
    branch          TEXT,
    details         TEXT NOT NULL DEFAULT '{}',
    created_at      REAL NOT NULL
);

CREATE INDEX rq_lineage_source ON rq_lineage (source_trace_id);

CREATE TABLE rq_steps (
    job_id       INTEGER NOT NULL,
    step_key     TEXT    NOT NULL,
    step_name    TEXT    NOT NULL,
    attempt      INTEGER NOT NULL,
    trace_id     TEXT    NOT NULL,
    result       TEXT,
    result_ref   TEXT,
    completed_at REAL    NOT NULL,
    PRIMARY KEY (job_id, step_key)
);

CREATE TABLE rq_active_versions (
    job_type      TEXT NOT NULL PRIMARY KEY,
    version       TEXT NOT NULL,
    registered_at REAL NOT NULL
);

CREATE TABLE rq_routing (
    job_type   TEXT    NOT NULL PRIMARY KEY,
    body       TEXT    NOT NULL,
    revision   INTEGER NOT NULL,
    updated_at REAL    NOT NULL
);

CREATE TABLE rq_routing_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    job_type TEXT    NOT NULL,
    revision INTEGER NOT NULL,
    action   TEXT    NOT NULL,
    actor    TEXT    NOT NULL,
    reason   TEXT,
    body     TEXT    NOT NULL,
    ts       REAL    NOT NULL
);

CREATE INDEX rq_routing_events_type ON rq_routing_events (job_type, id);

CREATE TABLE rq_rollout_comparisons (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    job_type     TEXT    NOT NULL,
    job_id       INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    mode         TEXT    NOT NULL,
    from_version TEXT,
    to_version   TEXT    NOT NULL,
    classes      TEXT    NOT NULL,
    report       TEXT    NOT NULL,
    ts           REAL    NOT NULL
);

CREATE INDEX rq_rollout_comparisons_type ON rq_rollout_comparisons (job_type, to_version, id);

CREATE TABLE rq_schedules (
    name          TEXT NOT NULL PRIMARY KEY,
    cron          TEXT NOT NULL,
    job_type      TEXT NOT NULL,
    timezone      TEXT NOT NULL,
    missed        TEXT NOT NULL,
    anchor        REAL NOT NULL,
    last_slot     REAL,
    last_job_id   INTEGER,
    next_slot     REAL,
    updated_at    REAL NOT NULL
);

CREATE TABLE rq_trace (
    id        INTEGER PRIMARY KEY,
    trace_id  TEXT    NOT NULL,
    job_id    INTEGER,
    attempt   INTEGER,
    worker_id TEXT,
    hlc       INTEGER NOT NULL,
    hlc_last  INTEGER NOT NULL,
    ts        REAL    NOT NULL,
    events    TEXT    NOT NULL
);

CREATE INDEX rq_trace_job ON rq_trace (job_id, id);

CREATE INDEX rq_trace_derived ON rq_trace (trace_id, id) WHERE job_id IS NULL;

CREATE INDEX rq_trace_hlc ON rq_trace (hlc_last);

CREATE TABLE rq_trace_resources (
    resource TEXT    NOT NULL,
    hlc      INTEGER NOT NULL,
    pack_id  INTEGER NOT NULL,
    PRIMARY KEY (resource, hlc, pack_id)
) WITHOUT ROWID;

CREATE TABLE rq_keep (
    job_id  INTEGER PRIMARY KEY,
    reason  TEXT    NOT NULL,
    kept_at REAL    NOT NULL
);

CREATE TABLE rq_gc (
    name       TEXT    PRIMARY KEY,
    cursor     INTEGER NOT NULL,
    updated_at REAL    NOT NULL
);

CREATE TABLE rq_job_hours (
    job_type  TEXT    NOT NULL,
    version   TEXT    NOT NULL,
    hour      REAL NOT NULL,
    state     TEXT    NOT NULL,
    jobs      INTEGER NOT NULL,
    attempts  INTEGER NOT NULL,
    PRIMARY KEY (job_type, version, hour, state)
);

CREATE TABLE rq_gc_holds (
    holder     TEXT    PRIMARY KEY,
    job_id     INTEGER NOT NULL,
    expires_at REAL    NOT NULL
);

CREATE INDEX rq_gc_holds_job ON rq_gc_holds (job_id);

CREATE INDEX rq_lineage_created ON rq_lineage (created_at);

CREATE INDEX rq_outbox_job ON rq_outbox (job_id);

CREATE TABLE "rq_entities" (
    branch    TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    version   INTEGER NOT NULL,
    hlc       INTEGER NOT NULL,
    PRIMARY KEY (branch, namespace, key)
) WITHOUT ROWID;

CREATE TABLE "rq_jobs" (
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
, enqueued_hlc INTEGER, enqueued BLOB);

CREATE INDEX rq_jobs_ready ON rq_jobs (priority DESC, run_at, id) WHERE state = 'queued';

CREATE INDEX rq_jobs_lease_deadline ON rq_jobs (lease_deadline) WHERE state = 'running';

CREATE INDEX rq_jobs_ordering ON rq_jobs (ordering_key, id)
    WHERE state IN ('queued', 'running') AND ordering_key IS NOT NULL;

CREATE INDEX rq_jobs_trace ON rq_jobs (trace_id);

CREATE UNIQUE INDEX rq_jobs_message ON rq_jobs (job_type, message_id);

CREATE INDEX rq_jobs_failed ON rq_jobs (state, id) WHERE state IN ('dead', 'cancelled');

CREATE TRIGGER rq_jobs_id_floor AFTER DELETE ON rq_jobs
WHEN OLD.id > COALESCE((SELECT MAX(id) FROM rq_jobs), 0)
BEGIN
    INSERT INTO rq_gc (name, cursor, updated_at)
    VALUES ('job_id_floor', OLD.id, (julianday('now') - 2440587.5) * 86400.0)
    ON CONFLICT (name) DO UPDATE SET cursor = MAX(cursor, excluded.cursor),
                                     updated_at = excluded.updated_at;
END;

CREATE INDEX rq_jobs_enqueued_hlc ON rq_jobs (enqueued_hlc) WHERE enqueued_hlc IS NOT NULL;

CREATE VIEW rq_packs AS
SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace
UNION ALL
SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs WHERE enqueued_hlc IS NOT NULL;

CREATE VIEW rq_pack_events AS
SELECT p.id * 1024 + e.key AS id,
       p.trace_id AS trace_id,
       p.job_id AS job_id,
       p.attempt AS attempt,
       COALESCE(json_extract(e.value, '$.k'), 'domain') AS kind,
       json_extract(e.value, '$.n') AS name,
       json_extract(e.value, '$.q') AS seq,
       json_extract(e.value, '$.s') AS step,
       p.ts + COALESCE(json_extract(e.value, '$.dt'), 0) / 1e6 AS ts,
       p.hlc + COALESCE(json_extract(e.value, '$.h'), 0) AS hlc,
       p.worker_id AS worker_id,
       json_extract(e.value, '$.st') AS status,
       json_extract(e.value, '$.r') AS resource,
       json_extract(e.value, '$.v') AS resource_version,
       COALESCE(json_extract(e.value, '$.x'), 0) AS side_effect,
       json_extract(e.value, '$.i') AS input_ref,
       json_extract(e.value, '$.o') AS output_ref,
       COALESCE(json_extract(e.value, '$.d'), '{}') AS data,
       p.hlc AS pack_hlc,
       p.hlc_last AS pack_hlc_last
FROM rq_trace AS p, json_each(rq_pack_json(p.events)) AS e;

CREATE VIEW rq_enqueued_events AS
SELECT p.id * 1024 + e.key AS id,
       p.trace_id AS trace_id,
       p.job_id AS job_id,
       p.attempt AS attempt,
       COALESCE(json_extract(e.value, '$.k'), 'domain') AS kind,
       json_extract(e.value, '$.n') AS name,
       json_extract(e.value, '$.q') AS seq,
       json_extract(e.value, '$.s') AS step,
       p.ts + COALESCE(json_extract(e.value, '$.dt'), 0) / 1e6 AS ts,
       p.hlc + COALESCE(json_extract(e.value, '$.h'), 0) AS hlc,
       p.worker_id AS worker_id,
       json_extract(e.value, '$.st') AS status,
       json_extract(e.value, '$.r') AS resource,
       json_extract(e.value, '$.v') AS resource_version,
       COALESCE(json_extract(e.value, '$.x'), 0) AS side_effect,
       json_extract(e.value, '$.i') AS input_ref,
       json_extract(e.value, '$.o') AS output_ref,
       COALESCE(json_extract(e.value, '$.d'), '{}') AS data,
       p.hlc AS pack_hlc,
       p.hlc_last AS pack_hlc_last
FROM (SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs WHERE enqueued_hlc IS NOT NULL) AS p, json_each(rq_pack_json(p.events)) AS e;

CREATE VIEW rq_events AS
SELECT * FROM rq_pack_events
UNION ALL
SELECT * FROM rq_enqueued_events;

CREATE TABLE "rq_idempotency" (
    key          TEXT    PRIMARY KEY,
    operation    TEXT    NOT NULL,
    status       TEXT    NOT NULL
                 CHECK (status = 'started' OR status = 'succeeded' OR status = 'failed'
                        OR status = 'compensated'),
    result       TEXT,
    result_ref   TEXT,
    error        TEXT,
    claim_token  TEXT    NOT NULL,
    started_at   REAL    NOT NULL,
    completed_at REAL,
    trace_id     TEXT,
    job_id       INTEGER,
    attempt      INTEGER
);

CREATE INDEX rq_idempotency_job ON rq_idempotency (job_id);

CREATE TABLE "rq_blobs" (
    hash        BLOB    PRIMARY KEY CHECK (typeof(hash) = 'blob' AND length(hash) = 32),
    codec       TEXT    NOT NULL,
    size        INTEGER NOT NULL,
    stored_size INTEGER NOT NULL,
    body        BLOB    NOT NULL,
    created_at  REAL    NOT NULL,
    used_at     REAL    NOT NULL DEFAULT 0
);

CREATE TRIGGER rq_jobs_trace_ids AFTER DELETE ON rq_jobs
BEGIN
    UPDATE rq_entity_versions SET trace_id = OLD.trace_id
    WHERE job_id = OLD.id AND trace_id IS NULL;
    UPDATE rq_idempotency SET trace_id = OLD.trace_id
    WHERE job_id = OLD.id AND trace_id IS NULL;
END;

CREATE VIEW rq_entity_versions_read AS
SELECT v.branch, v.namespace, v.key, v.version, v.parent_version, v.data, v.data_ref, v.delta,
       v.job_id,
       CASE WHEN v.trace_id IS NULL THEN (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = v.job_id)
            WHEN typeof(v.trace_id) = 'blob' THEN NULL
            ELSE v.trace_id END AS trace_id,
       v.attempt, v.fencing_token, v.created_at, v.hlc
FROM rq_entity_versions AS v;

CREATE VIEW rq_idempotency_read AS
SELECT i.key, i.operation, i.status, i.result, i.result_ref, i.error, i.claim_token, i.started_at,
       i.completed_at,
       CASE WHEN i.trace_id IS NULL THEN (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = i.job_id)
            WHEN typeof(i.trace_id) = 'blob' THEN NULL
            ELSE i.trace_id END AS trace_id,
       i.job_id, i.attempt
FROM rq_idempotency AS i;

CREATE TABLE rq_pack_dictionaries (
    id         INTEGER PRIMARY KEY,
    job_type   TEXT    NOT NULL UNIQUE,
    text       BLOB    NOT NULL,
    job_id     INTEGER,
    learned_at REAL    NOT NULL
);
