-- Content-addressed, compressed, deduplicated blobs.
-- PostgreSQL flavour of storage/sqlite/blobs.sql: same query names and parameters.

-- name: blob_put
INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at)
VALUES (%(hash)s, %(codec)s, %(size)s, %(stored_size)s, %(body)s, %(now)s)
ON CONFLICT (hash) DO NOTHING;

-- name: blob_get
SELECT codec, body FROM rq_blobs WHERE hash = %(hash)s;
