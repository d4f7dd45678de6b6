-- Periodic jobs: each schedule's newest decided slot, moved by compare-and-set.
-- PostgreSQL flavour of storage/sqlite/schedules.sql: same query names and parameters.

-- name: schedule_register
-- A schedule seen for the first time is anchored at now (slots after it are due);
-- a redeclared one keeps its anchor and takes the new cron, job type and policy.
INSERT INTO rq_schedules (name, cron, job_type, timezone, missed, anchor, next_slot, updated_at)
VALUES (%(name)s, %(cron)s, %(job_type)s, %(timezone)s, %(missed)s, %(now)s, %(next_slot)s,
        %(now)s)
ON CONFLICT (name) DO UPDATE SET
    cron = excluded.cron, job_type = excluded.job_type, timezone = excluded.timezone,
    missed = excluded.missed;

-- name: schedule_advance
-- Only the scheduler that read the expected anchor moves it: a second scheduler that
-- decided the same slots finds the anchor moved and enqueues nothing.
UPDATE rq_schedules SET anchor = %(anchor)s, next_slot = %(next_slot)s, updated_at = %(now)s
WHERE name = %(name)s AND anchor = %(expected_anchor)s;

-- name: schedule_made
UPDATE rq_schedules SET last_slot = %(last_slot)s, last_job_id = %(last_job_id)s
WHERE name = %(name)s;

-- name: schedule_list
SELECT * FROM rq_schedules WHERE (%(name)s::text IS NULL OR name = %(name)s::text) ORDER BY name;
