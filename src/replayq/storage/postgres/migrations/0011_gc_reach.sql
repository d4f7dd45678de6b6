-- PostgreSQL flavour of storage/sqlite/migrations/0011_gc_reach.sql.
-- 0011 gc: holds of live forks and dry-runs, blobs collected by reachability, derived
-- traces collected by age.

-- A fork, dry-run or verification in progress holds the job it runs from: gc neither trims
-- nor deletes a held job, nor collects the derived traces of it, until the holder releases
-- the hold (at its end) or the hold expires (a holder that died).
CREATE TABLE rq_gc_holds (
    holder     TEXT    PRIMARY KEY,
    job_id     BIGINT  NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

CREATE INDEX rq_gc_holds_job ON rq_gc_holds (job_id);

-- When a blob was last stored: storing a value whose blob exists already touches it, so gc
-- (which collects only blobs nobody stored within its grace period) never removes a blob
-- that a commit in flight is about to reference.
ALTER TABLE rq_blobs ADD COLUMN used_at DOUBLE PRECISION NOT NULL DEFAULT 0;

UPDATE rq_blobs SET used_at = created_at;

-- gc's scan of derived traces (replays, forks, verifications) by age.
CREATE INDEX rq_lineage_created ON rq_lineage (created_at);

-- Message-id dedup per job type: the same message id enqueued for two job types makes two
-- jobs (it was unique across every type).
ALTER TABLE rq_jobs DROP CONSTRAINT rq_jobs_message_id_key;

CREATE UNIQUE INDEX rq_jobs_message ON rq_jobs (job_type, message_id);
