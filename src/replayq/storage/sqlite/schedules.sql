-- Periodic jobs: each schedule's newest decided slot, moved by compare-and-set.

-- name: schedule_register
-- A schedule seen for the first time is anchored at :now (slots after it are due);
-- a redeclared one keeps its anchor and takes the new cron, job type and policy.
INSERT INTO rq_schedules (name, cron, job_type, timezone, missed, anchor, next_slot, updated_at)
VALUES (:name, :cron, :job_type, :timezone, :missed, :now, :next_slot, :now)
ON CONFLICT (name) DO UPDATE SET
    cron = excluded.cron, job_type = excluded.job_type, timezone = excluded.timezone,
    missed = excluded.missed;

-- name: schedule_advance
-- Only the scheduler that read the expected anchor moves it: a second scheduler that
-- decided the same slots finds the anchor moved and enqueues nothing.
UPDATE rq_schedules SET anchor = :anchor, next_slot = :next_slot, updated_at = :now
WHERE name = :name AND anchor = :expected_anchor;

-- name: schedule_made
UPDATE rq_schedules SET last_slot = :last_slot, last_job_id = :last_job_id
WHERE name = :name;

-- name: schedule_list
SELECT * FROM rq_schedules WHERE (:name IS NULL OR name = :name) ORDER BY name;
