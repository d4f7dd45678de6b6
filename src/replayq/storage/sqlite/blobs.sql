-- Content-addressed, compressed, deduplicated blobs.

-- name: blob_put
INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at)
VALUES (:hash, :codec, :size, :stored_size, :body, :now)
ON CONFLICT (hash) DO NOTHING;

-- name: blob_get
SELECT codec, body FROM rq_blobs WHERE hash = :hash;
