-- Content-addressed, compressed, deduplicated blobs.
-- The key (hash) is the SHA-256's 32 bytes (migration 0026), not its hex: the verbs
-- (context_verbs.py) convert the hex of a reference (blob:sha256:<hex>) at this seam.
-- PostgreSQL flavour of storage/sqlite/blobs.sql: same query names and parameters.

-- name: blob_put
-- Stored again (same hash): only touched (``used_at``), so that gc, which collects a blob
-- only when nobody stored it within its grace period, spares a blob a commit is about to
-- reference. Touched at most every 10 minutes (gc's grace is longer).
INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at, used_at)
VALUES (%(hash)s, %(codec)s, %(size)s, %(stored_size)s, %(body)s, %(now)s, %(now)s)
ON CONFLICT (hash) DO UPDATE SET used_at = excluded.used_at
WHERE rq_blobs.used_at < excluded.used_at - 600;

-- name: blob_get
SELECT codec, body FROM rq_blobs WHERE hash = %(hash)s;
