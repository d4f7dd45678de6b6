-- Idempotency records: one per business key, claimed before the side effect runs.

-- name: idem_claim
INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at, trace_id, job_id,
                            attempt)
VALUES (:key, :operation, 'started', :claim_token, :now, :trace_id, :job_id, :attempt)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: idem_get
SELECT * FROM rq_idempotency WHERE key = :key;

-- name: idem_takeover
UPDATE rq_idempotency
SET status = 'started', claim_token = :claim_token, started_at = :now, completed_at = NULL,
    error = NULL, trace_id = :trace_id, job_id = :job_id, attempt = :attempt
WHERE key = :key AND status = :expected_status AND claim_token = :expected_claim;

-- name: idem_succeed
UPDATE rq_idempotency
SET status = 'succeeded', result = :result, result_ref = :result_ref, completed_at = :now
WHERE key = :key AND claim_token = :claim_token AND status = 'started';

-- name: idem_fail
UPDATE rq_idempotency
SET status = 'failed', error = :error, completed_at = :now
WHERE key = :key AND claim_token = :claim_token AND status = 'started';

-- name: idem_compensate
UPDATE rq_idempotency SET status = 'compensated', completed_at = :now
WHERE key = :key AND status = 'succeeded';

-- name: idem_by_job
SELECT * FROM rq_idempotency WHERE job_id = :job_id ORDER BY started_at;

-- name: idem_list
-- Effect records, newest first. ``in_doubt``: ``started`` by an attempt that is no longer
-- running (it crashed or lost its lease mid-effect), so nobody will ever finish the record.
SELECT i.*,
       (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt)) AS in_doubt
FROM rq_idempotency AS i
WHERE (:operation IS NULL OR i.operation = :operation)
  AND (NOT :in_doubt OR (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt)))
ORDER BY i.started_at DESC
LIMIT :limit;

-- name: idem_resolve
-- Settle an in-doubt record (a human or a reconciler): compare-and-set on the claim
-- token that was read, so a record taken over meanwhile is left alone.
UPDATE rq_idempotency
SET status = :status, result = :result, result_ref = NULL, error = :error, completed_at = :now
WHERE key = :key AND status = 'started' AND claim_token = :claim_token;
