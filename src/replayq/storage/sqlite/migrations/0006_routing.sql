-- 0006 routing: per job type, which versions new jobs go to (weights, pins, shadow,
-- dual-run) as one JSON record with a revision, every change an event with who and
-- why, and the comparisons shadow and dual-run runs store for `rollout status`.

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
