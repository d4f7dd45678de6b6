-- 0002 context: versioned copy-on-write state, lease locks with fencing,
-- idempotency records, versioned cache, transactional outbox, blob store, lineage.

CREATE TABLE rq_blobs (
    hash        TEXT    PRIMARY KEY,
    codec       TEXT    NOT NULL,
    size        INTEGER NOT NULL,
    stored_size INTEGER NOT NULL,
    body        BLOB    NOT NULL,
    created_at  REAL    NOT NULL
);

-- One row per version of an entity; a branch ('main' in production) reads
-- through to its base for entities it has not written (copy-on-write).
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

-- The head pointer per entity and branch: the compare-and-set target of writes.
CREATE TABLE rq_entities (
    branch    TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    version   INTEGER NOT NULL,
    hlc       INTEGER NOT NULL,
    PRIMARY KEY (branch, namespace, key)
);

CREATE TABLE rq_branches (
    branch      TEXT    PRIMARY KEY,
    base_branch TEXT    NOT NULL,
    base_hlc    INTEGER NOT NULL,
    origin      TEXT    NOT NULL,
    created_at  REAL    NOT NULL
);

-- A lease lock per resource. Rows stay after release so the fencing token keeps
-- growing across holders.
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

CREATE TABLE rq_idempotency (
    key          TEXT    PRIMARY KEY,
    operation    TEXT    NOT NULL,
    status       TEXT    NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'compensated')),
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

-- Derived traces (replay, fork, rerun) point to the trace they came from.
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
