-- Lease locks with owner tokens and a fencing token that grows with every acquisition.

-- name: lock_acquire
INSERT INTO rq_locks (resource, owner_token, fencing_token, job_id, worker_id, acquired_at,
                      expires_at, hlc)
VALUES (:resource, :owner_token, 1, :job_id, :worker_id, :now, :now + :ttl, :hlc)
ON CONFLICT (resource) DO UPDATE
SET owner_token = excluded.owner_token,
    fencing_token = rq_locks.fencing_token + 1,
    job_id = excluded.job_id,
    worker_id = excluded.worker_id,
    acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at,
    hlc = MAX(rq_locks.hlc + 1, excluded.hlc)
WHERE rq_locks.owner_token IS NULL OR rq_locks.expires_at < :now
RETURNING fencing_token, hlc;

-- name: lock_get
SELECT * FROM rq_locks WHERE resource = :resource;

-- name: lock_renew
UPDATE rq_locks SET expires_at = :now + :ttl
WHERE resource = :resource AND owner_token = :owner_token;

-- name: lock_release
UPDATE rq_locks SET owner_token = NULL, expires_at = NULL, hlc = MAX(hlc + 1, :hlc)
WHERE resource = :resource AND owner_token = :owner_token
RETURNING *;

-- name: lock_list
SELECT * FROM rq_locks WHERE owner_token IS NOT NULL ORDER BY resource;

-- name: lock_break
-- Breaking bumps the fencing token, so the old holder's later writes are rejected.
UPDATE rq_locks
SET owner_token = NULL, expires_at = NULL, fencing_token = fencing_token + 1,
    hlc = MAX(hlc + 1, :hlc)
WHERE resource = :resource AND owner_token IS NOT NULL
RETURNING *;
