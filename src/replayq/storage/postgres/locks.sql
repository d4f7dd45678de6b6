-- Lease locks with owner tokens and a fencing token that grows with every acquisition.
-- Lock TTLs are judged by :lock_now, or when it is NULL by the database's own clock
-- (one clock for every worker: a worker whose clock runs fast cannot take a live lock).
-- PostgreSQL flavour of storage/sqlite/locks.sql: same query names and parameters, and
-- lock_fence_refusing and lock_wait_bound, this backend's alone (a commit in one round trip;
-- an acquisition's bound on its wait for a row lock).
-- A write's fence (lock_fence, lock_fence_refusing) keeps the lock's row FOR SHARE until
-- its transaction ends: under READ COMMITTED a plain read let another worker take the
-- lock again (lock_acquire) and commit its writes between the fence and our COMMIT, our
-- write under the old token then committing after the new holder's. Now lock_acquire,
-- lock_renew, lock_release and lock_break of that row wait for the fenced commit (at most
-- its duration), and a fence asked while one of them is uncommitted waits for it and reads
-- the row as it left it (READ COMMITTED's FOR SHARE reads the newest version).
-- A worker frozen inside a commit in one round trip holds that row until it thaws or its
-- session ends, so each of them can bound its wait: an acquisition with lock_wait_bound (or
-- SET LOCAL queued in its pipeline); lock_renew, lock_release, lock_release_in_time and
-- lock_break in their own WHERE (:lock_timeout, NULL for no bound): set_config there, a
-- filter on the row the statement is about to write, runs before the statement waits for
-- that row, and sets lock_timeout for the rest of its transaction as SET LOCAL would,
-- parameterised and with no statement or round trip of its own. Past it 55P03
-- (lock_not_available), the transaction rolled back.

-- name: lock_acquire
INSERT INTO rq_locks (resource, owner_token, fencing_token, job_id, worker_id, acquired_at,
                      expires_at, hlc)
VALUES (%(resource)s, %(owner_token)s, 1, %(job_id)s, %(worker_id)s, COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8),
        COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8) + %(ttl)s, %(hlc)s)
ON CONFLICT (resource) DO UPDATE
SET owner_token = excluded.owner_token,
    fencing_token = rq_locks.fencing_token + 1,
    job_id = excluded.job_id,
    worker_id = excluded.worker_id,
    acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at,
    hlc = GREATEST(rq_locks.hlc + 1, excluded.hlc)
WHERE rq_locks.owner_token IS NULL OR rq_locks.expires_at < COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8)
RETURNING fencing_token, hlc;

-- name: lock_wait_bound
-- This backend's alone: how long the rest of an acquisition's transaction may wait for a
-- row lock (``LockAcquire.wait``; SET LOCAL's effect, parameterised: an acquisition outside
-- a pipeline; in one, ``lock_transition`` queues SET LOCAL itself). Past it the waiting
-- statement fails with 55P03 (lock_not_available), the transaction rolls back, and the
-- acquisition reads it as "not granted yet"; the setting ends with the transaction.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- name: lock_get
-- ``expired``: the lease ran out, judged like the acquisition (the database's clock unless
-- :lock_now is given).
SELECT *, (expires_at IS NOT NULL AND expires_at < COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8)) AS expired
FROM rq_locks WHERE resource = %(resource)s;

-- name: lock_fence
-- lock_get for a write's fence, as the careful commit asks it (``LockFilter.newer_than``;
-- the caller compares the tokens): the row kept FOR SHARE until the transaction ends, so
-- the lock is not taken again between the fence and the COMMIT. Not for ctx.lock's own
-- reads or the CLI, which must not hold up a lock's holder.
SELECT *, (expires_at IS NOT NULL AND expires_at < COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8)) AS expired
FROM rq_locks WHERE resource = %(resource)s
FOR SHARE;

-- name: lock_fence_refusing
-- The fence of a write under a lock, sent unread by a commit in one round trip
-- (``pipelined(refusals=True)``): lock_fence's row, kept FOR SHARE as lock_fence keeps it,
-- asked only whether its fencing token moved past the write's (taken again, or broken:
-- ``LockFilter.newer_than``). If it did, rq_require refuses (RQ003) and the whole
-- transaction with it; the commit made again reads lock_fence and says so
-- (``state.write_rejected``). No row, or a row whose token is the write's (held, released
-- or run out with nobody taking it), passes, as in the careful commit. The row is chosen
-- by its resource alone, whatever its token, so that it is locked when the fence passes.
SELECT rq_require(COALESCE((SELECT fencing_token <= %(fencing_token)s FROM rq_locks
                            WHERE resource = %(resource)s
                            FOR SHARE),
                           true),
                  'RQ003', 'lock_fence_refusing: the lock''s fencing token moved past the write''s');

-- name: lock_renew
UPDATE rq_locks SET expires_at = COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8) + %(ttl)s
WHERE resource = %(resource)s AND owner_token = %(owner_token)s
  AND (%(lock_timeout)s::text IS NULL OR set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL);

-- name: lock_release
UPDATE rq_locks SET owner_token = NULL, expires_at = NULL, hlc = GREATEST(hlc + 1, %(hlc)s)
WHERE resource = %(resource)s AND owner_token = %(owner_token)s
  AND (%(lock_timeout)s::text IS NULL OR set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL)
RETURNING *;

-- name: lock_release_in_time
-- A holder's release, only while its lease has not run out (judged like lock_get's
-- ``expired``): no row changed says the lock ran out or was taken or broken meanwhile.
-- In a commit in one round trip it is sent unread as lock_release_in_time_refusing, which
-- refuses (RQ001) unless it changed the row. A step's commit releases so a lock whose
-- writes it fenced: it holds the row FOR SHARE already (lock_fence_refusing) and only
-- upgrades its own row lock, never waiting for another's (:lock_timeout NULL there).
UPDATE rq_locks SET owner_token = NULL, expires_at = NULL, hlc = GREATEST(hlc + 1, %(hlc)s)
WHERE resource = %(resource)s AND owner_token = %(owner_token)s
  AND expires_at >= COALESCE(%(lock_now)s::float8, extract(epoch FROM statement_timestamp())::float8)
  AND (%(lock_timeout)s::text IS NULL OR set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL);

-- name: lock_list
SELECT * FROM rq_locks WHERE owner_token IS NOT NULL ORDER BY resource;

-- name: lock_break
-- Breaking bumps the fencing token, so the old holder's later writes are rejected.
UPDATE rq_locks
SET owner_token = NULL, expires_at = NULL, fencing_token = fencing_token + 1,
    hlc = GREATEST(hlc + 1, %(hlc)s)
WHERE resource = %(resource)s AND owner_token IS NOT NULL
  AND (%(lock_timeout)s::text IS NULL OR set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL)
RETURNING *;
