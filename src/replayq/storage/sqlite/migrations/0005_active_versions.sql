-- 0005 active versions: which declared version of each job type the last worker
-- to start runs for new jobs, so that a producer that does not declare the type
-- (replayq enqueue TYPE without --app) enqueues under that version's contract.

CREATE TABLE rq_active_versions (
    job_type      TEXT NOT NULL PRIMARY KEY,
    version       TEXT NOT NULL,
    registered_at REAL NOT NULL
);
