-- The transactional outbox: rows written in the step's transaction, published later.
-- PostgreSQL flavour of storage/sqlite/outbox.sql: same query names and parameters.

-- name: outbox_insert
-- The event id is stable per job, step position and publish position: a step that runs
-- again (a retry without resume, a with-block) writes the same id, and the first row stays.
INSERT INTO rq_outbox (event_id, topic, payload, job_id, trace_id, created_at)
VALUES (%(event_id)s, %(topic)s, %(payload)s, %(job_id)s, %(trace_id)s, %(now)s)
ON CONFLICT (event_id) DO NOTHING;

-- name: outbox_claim
UPDATE rq_outbox
SET claimed_until = %(now)s + %(claim_seconds)s, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM rq_outbox
    WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < %(now)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: outbox_mark_published
UPDATE rq_outbox SET published_at = %(now)s, claimed_until = NULL, last_error = NULL
WHERE id = %(id)s AND published_at IS NULL;

-- name: outbox_mark_failed
UPDATE rq_outbox SET claimed_until = NULL, last_error = %(error)s
WHERE id = %(id)s AND published_at IS NULL;

-- name: outbox_backlog
SELECT COUNT(*) AS pending, MIN(created_at) AS oldest FROM rq_outbox WHERE published_at IS NULL;

-- name: outbox_by_job
SELECT * FROM rq_outbox WHERE job_id = %(job_id)s ORDER BY id;
