-- Idempotency records: one per business key, claimed before the side effect runs.
--
-- A record's trace id is stored as a state version's is (state.sql, migration 0028): none
-- when it is its job's (read from rq_jobs), X'' for a job's record claimed with none; read
-- through the view rq_idempotency_read (0028).

-- name: idem_claim
INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at, trace_id, job_id,
                            attempt)
VALUES (:key, :operation, 'started', :claim_token, :now,
        CASE WHEN :trace_id = (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = :job_id) THEN NULL
             WHEN :trace_id IS NULL AND :job_id IS NOT NULL THEN X''
             ELSE :trace_id END,
        :job_id, :attempt)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: idem_get
SELECT * FROM rq_idempotency_read AS i WHERE i.key = :key;

-- name: idem_get_judged
-- The record of ``key`` with ``in_doubt`` judged: ``started`` and its attempt not running
-- under a lease that has not ended by ``lease_now`` (NULL: the database's clock), as the
-- reaper judges leases. One statement: the record and its job are read together.
SELECT i.*,
       (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt
             AND j.lease_deadline
                 >= COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0))) AS in_doubt
FROM rq_idempotency_read AS i
WHERE i.key = :key;

-- name: idem_takeover
UPDATE rq_idempotency
SET status = 'started', claim_token = :claim_token, started_at = :now, completed_at = NULL,
    error = NULL, job_id = :job_id, attempt = :attempt,
    trace_id = CASE
        WHEN :trace_id = (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = :job_id) THEN NULL
        WHEN :trace_id IS NULL AND :job_id IS NOT NULL THEN X''
        ELSE :trace_id END
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
SELECT * FROM rq_idempotency_read AS i WHERE i.job_id = :job_id ORDER BY i.started_at;

-- name: idem_list
-- Effect records, newest first. ``in_doubt``: ``started`` by an attempt that is no longer
-- running (it crashed or lost its lease mid-effect), so nobody will ever finish the record.
SELECT i.*,
       (i.status = 'started' AND NOT EXISTS (
           SELECT 1 FROM rq_jobs AS j
           WHERE j.id = i.job_id AND j.state = 'running' AND j.attempt = i.attempt)) AS in_doubt
FROM rq_idempotency_read AS i
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
