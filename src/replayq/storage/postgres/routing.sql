-- Named queries for rollouts (PostgreSQL): routing records, their change events, the
-- version a job is routed to, shadow/dual-run comparisons and per-version outcomes.

-- name: routing_list
SELECT job_type, body, revision, updated_at FROM rq_routing
WHERE (%(job_type)s::text IS NULL OR job_type = %(job_type)s::text)
ORDER BY job_type;

-- name: routing_insert
INSERT INTO rq_routing (job_type, body, revision, updated_at)
VALUES (%(job_type)s, %(body)s, 1, %(now)s)
ON CONFLICT (job_type) DO NOTHING;

-- name: routing_update
-- Compare-and-set on the revision the caller read: two operators never overwrite
-- each other's change unseen.
UPDATE rq_routing SET body = %(body)s, revision = revision + 1, updated_at = %(now)s
WHERE job_type = %(job_type)s AND revision = %(expected_revision)s;

-- name: routing_event_append
INSERT INTO rq_routing_events (job_type, revision, action, actor, reason, body, ts)
VALUES (%(job_type)s, %(revision)s, %(action)s, %(actor)s, %(reason)s, %(body)s, %(now)s);

-- name: routing_events
SELECT id, job_type, revision, action, actor, reason, body, ts FROM rq_routing_events
WHERE job_type = %(job_type)s ORDER BY id;

-- name: job_route
-- The version a job runs under is chosen once, at its first lease, and kept; the
-- worker calls this only for a job leased without one (or with one it lacks).
UPDATE rq_jobs SET handler_version = %(version)s::text
WHERE id = %(job_id)s AND owner_token = %(owner_token)s AND state = 'running';

-- name: job_reroute
-- Rollback: queued jobs of a type move from one version to another (never running ones).
UPDATE rq_jobs SET handler_version = %(to_version)s
WHERE job_type = %(job_type)s AND state = 'queued' AND handler_version = %(from_version)s;

-- name: comparison_put
INSERT INTO rq_rollout_comparisons (job_type, job_id, attempt, mode, from_version, to_version,
                                    classes, report, ts)
VALUES (%(job_type)s, %(job_id)s, %(attempt)s, %(mode)s, %(from_version)s, %(to_version)s, %(classes)s, %(report)s,
        %(now)s);

-- name: comparison_list
SELECT id, job_type, job_id, attempt, mode, from_version, to_version, classes, report, ts
FROM rq_rollout_comparisons
WHERE job_type = %(job_type)s AND (%(mode)s::text IS NULL OR mode = %(mode)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: version_outcomes
-- Each attempt's end (and the worker's decision after it) for a type since a time,
-- with the version that ran it: the figures the ramp's gates compare.
SELECT e.job_id AS job_id, e.attempt AS attempt, e.name AS name,
       -- cache.read's data.version is the cached entity's: the job's version there.
       CASE WHEN e.name IN ('job.succeeded', 'job.failed') THEN e.data::jsonb ->> 'version'
            ELSE j.handler_version END AS version,
       e.data::jsonb ->> 'error_class' AS error_class,
       (e.data::jsonb ->> 'duration')::float8 AS duration,
       e.data::jsonb ->> 'reason' AS reason,
       (e.data::jsonb ->> 'stale')::boolean AS stale
FROM rq_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id
WHERE j.job_type = %(job_type)s
  AND j.origin = 'production'
  AND e.name IN ('job.succeeded', 'job.failed', 'retry.scheduled', 'job.dead',
                 'lease.expired', 'job.redelivered', 'lock.expired', 'cache.read')
  AND e.ts >= %(since)s
ORDER BY e.id;
