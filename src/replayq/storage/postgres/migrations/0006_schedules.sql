-- 0006 schedules: one row per periodic job (@app.periodic). `anchor` is the newest
-- slot already decided (enqueued or skipped, or the moment the schedule was first
-- seen); a scheduler moves it with a compare-and-set, so however many schedulers
-- run, each slot is decided by exactly one of them.

CREATE TABLE rq_schedules (
    name          TEXT NOT NULL PRIMARY KEY,
    cron          TEXT NOT NULL,
    job_type      TEXT NOT NULL,
    timezone      TEXT NOT NULL,
    missed        TEXT NOT NULL,
    anchor        DOUBLE PRECISION NOT NULL,
    last_slot     DOUBLE PRECISION,
    last_job_id   BIGINT,
    next_slot     DOUBLE PRECISION,
    updated_at    DOUBLE PRECISION NOT NULL
);
