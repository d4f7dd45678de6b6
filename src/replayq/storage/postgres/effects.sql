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
