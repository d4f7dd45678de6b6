-- Lease locks with owner tokens and a fencing token that grows with every acquisition.
-- Lock TTLs are judged by :lock_now, or when it is NULL by the database's own clock
-- (one clock for every worker: a worker whose clock runs fast cannot take a live lock).

-- name: lock_acquire
INSERT INTO rq_locks (resource, owner_token, fencing_token, job_id, worker_id, acquired_at,
                      expires_at, hlc)
VALUES (:resource, :owner_token, 1, :job_id, :worker_id, COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0),
        COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0) + :ttl, :hlc)
ON CONFLICT (resource) DO UPDATE
SET owner_token = excluded.owner_token,
    fencing_token = rq_locks.fencing_token + 1,
    job_id = excluded.job_id,
    worker_id = excluded.worker_id,
    acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at,
    hlc = MAX(rq_locks.hlc + 1, excluded.hlc)
WHERE rq_locks.owner_token IS NULL OR rq_locks.expires_at < COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0)
RETURNING fencing_token, hlc;

-- name: lock_get
-- ``expired``: the lease ran out, judged like the acquisition (the database's clock unless
-- :lock_now is given).
SELECT *, (expires_at IS NOT NULL AND expires_at < COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0)) AS expired
FROM rq_locks WHERE resource = :resource;

-- name: lock_fence
-- lock_get for a write's fence (``LockFilter.newer_than``). No row lock to take: the fence
-- runs in a write transaction (BEGIN IMMEDIATE), which holds the database's write lock
-- until it ends, so nobody takes the lock again between the fence and the COMMIT.
SELECT *, (expires_at IS NOT NULL AND expires_at < COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0)) AS expired
FROM rq_locks WHERE resource = :resource;

-- name: lock_renew
UPDATE rq_locks SET expires_at = COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0) + :ttl
WHERE resource = :resource AND owner_token = :owner_token;

-- name: lock_release
UPDATE rq_locks SET owner_token = NULL, expires_at = NULL, hlc = MAX(hlc + 1, :hlc)
WHERE resource = :resource AND owner_token = :owner_token
RETURNING *;

-- name: lock_release_in_time
-- A holder's release, only while its lease has not run out (judged like lock_get's
-- ``expired``): no row changed says the lock ran out or was taken or broken meanwhile.
UPDATE rq_locks SET owner_token = NULL, expires_at = NULL, hlc = MAX(hlc + 1, :hlc)
WHERE resource = :resource AND owner_token = :owner_token
  AND expires_at >= COALESCE(:lock_now, (julianday('now') - 2440587.5) * 86400.0);

-- name: lock_list
SELECT * FROM rq_locks WHERE owner_token IS NOT NULL ORDER BY resource;

-- name: lock_break
-- Breaking bumps the fencing token, so the old holder's later writes are rejected.
UPDATE rq_locks
SET owner_token = NULL, expires_at = NULL, fencing_token = fencing_token + 1,
    hlc = MAX(hlc + 1, :hlc)
WHERE resource = :resource AND owner_token IS NOT NULL
RETURNING *;
