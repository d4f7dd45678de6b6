-- PostgreSQL flavour of storage/sqlite/migrations/0010_retention.sql.
-- 0010 retention: pinned jobs that gc never collects, and where a gc pass got to.
-- A kept job (`replayq keep JOB --reason`) keeps its whole trace whatever its tier.
CREATE TABLE rq_keep (
    job_id  BIGINT  PRIMARY KEY,
    reason  TEXT    NOT NULL,
    kept_at DOUBLE PRECISION   NOT NULL
);

-- One row per gc pass kind: the last job id it finished with, so a killed pass resumes
-- there (reset to 0 when a pass reaches the end).
CREATE TABLE rq_gc (
    name       TEXT    PRIMARY KEY,
    cursor     BIGINT  NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- gc's scan: finished jobs by id.
CREATE INDEX rq_jobs_finished ON rq_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- The aggregates tier: what remains of the jobs gc deleted, counted per type, handler
-- version, hour (of finished_at, as epoch seconds) and final state.
CREATE TABLE rq_job_hours (
    job_type  TEXT    NOT NULL,
    version   TEXT    NOT NULL,
    hour      DOUBLE PRECISION NOT NULL,
    state     TEXT    NOT NULL,
    jobs      BIGINT NOT NULL,
    attempts  BIGINT NOT NULL,
    PRIMARY KEY (job_type, version, hour, state)
);
