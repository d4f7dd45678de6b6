-- Idempotency records: one per business key, claimed before the side effect runs.
-- PostgreSQL flavour of storage/sqlite/effects.sql: same query names and parameters.

-- name: idem_claim
INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at, trace_id, job_id,
                            attempt)
VALUES (%(key)s, %(operation)s, 'started', %(claim_token)s, %(now)s, %(trace_id)s, %(job_id)s, %(attempt)s)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: idem_get
SELECT * FROM rq_idempotency WHERE key = %(key)s;

-- name: idem_get_judged
-- The record of ``key`` with ``in_doubt`` judged: ``started`` and its attempt not running
-- under a lease that has not ended by ``lease_now`` (NULL: the database's clock), as the
-- reaper judges leases. One statement, one snapshot: the record and its job read together.
SELECT i.*,
       (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt
             AND j.lease_deadline >= COALESCE(%(lease_now)s::float8,
                                              extract(epoch FROM statement_timestamp())::float8)
       )) AS in_doubt
FROM rq_idempotency AS i
WHERE i.key = %(key)s;

-- name: idem_takeover
UPDATE rq_idempotency
SET status = 'started', claim_token = %(claim_token)s, started_at = %(now)s, completed_at = NULL,
    error = NULL, trace_id = %(trace_id)s, job_id = %(job_id)s, attempt = %(attempt)s
WHERE key = %(key)s AND status = %(expected_status)s AND claim_token = %(expected_claim)s;

-- name: idem_succeed
UPDATE rq_idempotency
SET status = 'succeeded', result = %(result)s, result_ref = %(result_ref)s, completed_at = %(now)s
WHERE key = %(key)s AND claim_token = %(claim_token)s AND status = 'started';

-- name: idem_fail
UPDATE rq_idempotency
SET status = 'failed', error = %(error)s, completed_at = %(now)s
WHERE key = %(key)s AND claim_token = %(claim_token)s AND status = 'started';

-- name: idem_compensate
UPDATE rq_idempotency SET status = 'compensated', completed_at = %(now)s
WHERE key = %(key)s AND status = 'succeeded';

-- name: idem_by_job
SELECT * FROM rq_idempotency WHERE job_id = %(job_id)s ORDER BY started_at;

-- name: idem_list
-- Effect records, newest first. ``in_doubt``: ``started`` by an attempt that is no longer
-- running (it crashed or lost its lease mid-effect), so nobody will ever finish the record.
SELECT i.*,
       (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt)) AS in_doubt
FROM rq_idempotency AS i
WHERE (%(operation)s::text IS NULL OR i.operation = %(operation)s::text)
  AND (NOT %(in_doubt)s::boolean OR (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt)))
ORDER BY i.started_at DESC
LIMIT %(limit)s;

-- name: idem_resolve
-- Settle an in-doubt record (a human or a reconciler): compare-and-set on the claim
-- token that was read, so a record taken over meanwhile is left alone.
UPDATE rq_idempotency
SET status = %(status)s, result = %(result)s, result_ref = NULL, error = %(error)s,
    completed_at = %(now)s
WHERE key = %(key)s AND status = 'started' AND claim_token = %(claim_token)s;
