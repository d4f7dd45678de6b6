-- 0007 schedules and cancels.
--
-- One row per periodic job (@app.periodic). `anchor` is the newest
-- slot already decided (enqueued or skipped, or the moment the schedule was first
-- seen); a scheduler moves it with a compare-and-set, so however many schedulers
-- run, each slot is decided by exactly one of them.

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

-- A cancel asked of a running job: its worker sees it at the next heartbeat, stops
-- extending the lease and raises JobCancelledError at the handler's next step
-- boundary or ctx call; the reaper cancels it if its lease runs out first.
ALTER TABLE rq_jobs ADD COLUMN cancel_requested_at REAL;

-- Questions across jobs by time (replayq events, signals --by): the trace by HLC.
CREATE INDEX rq_events_hlc ON rq_events (hlc);
