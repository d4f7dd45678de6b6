-- Named queries for rollouts (SQLite): routing records, their change events, the
-- version a job is routed to, shadow/dual-run comparisons and per-version outcomes.

-- name: routing_list
SELECT job_type, body, revision, updated_at FROM rq_routing
WHERE (:job_type IS NULL OR job_type = :job_type)
ORDER BY job_type;

-- name: routing_insert
INSERT INTO rq_routing (job_type, body, revision, updated_at)
VALUES (:job_type, :body, 1, :now)
ON CONFLICT (job_type) DO NOTHING;

-- name: routing_update
-- Compare-and-set on the revision the caller read: two operators never overwrite
-- each other's change unseen.
UPDATE rq_routing SET body = :body, revision = revision + 1, updated_at = :now
WHERE job_type = :job_type AND revision = :expected_revision;

-- name: routing_event_append
INSERT INTO rq_routing_events (job_type, revision, action, actor, reason, body, ts)
VALUES (:job_type, :revision, :action, :actor, :reason, :body, :now);

-- name: routing_events
SELECT id, job_type, revision, action, actor, reason, body, ts FROM rq_routing_events
WHERE job_type = :job_type ORDER BY id;

-- name: job_route
-- The version a job runs under is chosen once, at its first lease, and kept; the
-- worker calls this only for a job leased without one (or with one it lacks).
UPDATE rq_jobs SET handler_version = :version
WHERE id = :job_id AND owner_token = :owner_token AND state = 'running';

-- name: job_reroute
-- Rollback: queued jobs of a type move from one version to another (never running ones).
UPDATE rq_jobs SET handler_version = :to_version
WHERE job_type = :job_type AND state = 'queued' AND handler_version = :from_version;

-- name: comparison_put
INSERT INTO rq_rollout_comparisons (job_type, job_id, attempt, mode, from_version, to_version,
                                    classes, report, ts)
VALUES (:job_type, :job_id, :attempt, :mode, :from_version, :to_version, :classes, :report,
        :now);

-- name: comparison_list
SELECT id, job_type, job_id, attempt, mode, from_version, to_version, classes, report, ts
FROM rq_rollout_comparisons
WHERE job_type = :job_type AND (:mode IS NULL OR mode = :mode)
ORDER BY id DESC
LIMIT :limit;

-- name: version_outcomes
-- Each attempt's end (and the worker's decision after it) for a type since a time,
-- with the version that ran it: the figures the ramp's gates compare.
SELECT e.job_id AS job_id, e.attempt AS attempt, e.name AS name,
       -- cache.read's data.version is the cached entity's: the job's version there.
       CASE WHEN e.name IN ('job.succeeded', 'job.failed') THEN json_extract(e.data, '$.version')
            ELSE j.handler_version END AS version,
       json_extract(e.data, '$.error_class') AS error_class,
       json_extract(e.data, '$.duration') AS duration,
       json_extract(e.data, '$.reason') AS reason,
       json_extract(e.data, '$.stale') AS stale
-- rq_pack_events: none of these names is a job.enqueued (rq_enqueued_events).
FROM rq_pack_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id
WHERE j.job_type = :job_type
  AND j.origin = 'production'
  AND e.name IN ('job.succeeded', 'job.failed', 'retry.scheduled', 'job.dead',
                 'lease.expired', 'job.redelivered', 'lock.expired', 'cache.read')
  AND e.ts >= :since
ORDER BY e.id;
