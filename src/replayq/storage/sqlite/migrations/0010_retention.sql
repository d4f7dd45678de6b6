-- 0010 retention: pinned jobs that gc never collects, and where a gc pass got to.
-- A kept job (`replayq keep JOB --reason`) keeps its whole trace whatever its tier.
CREATE TABLE rq_keep (
    job_id  INTEGER PRIMARY KEY,
    reason  TEXT    NOT NULL,
    kept_at REAL    NOT NULL
);

-- One row per gc pass kind: the last job id it finished with, so a killed pass resumes
-- there (reset to 0 when a pass reaches the end).
CREATE TABLE rq_gc (
    name       TEXT    PRIMARY KEY,
    cursor     INTEGER NOT NULL,
    updated_at REAL    NOT NULL
);

-- gc's scan: finished jobs by id.
CREATE INDEX rq_jobs_finished ON rq_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- The aggregates tier: what remains of the jobs gc deleted, counted per type, handler
-- version, hour (of finished_at, as epoch seconds) and final state.
CREATE TABLE rq_job_hours (
    job_type  TEXT    NOT NULL,
    version   TEXT    NOT NULL,
    hour      REAL NOT NULL,
    state     TEXT    NOT NULL,
    jobs      INTEGER NOT NULL,
    attempts  INTEGER NOT NULL,
    PRIMARY KEY (job_type, version, hour, state)
);
