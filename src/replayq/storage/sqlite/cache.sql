-- The database cache: versioned keys (base:vN) plus the newest entry per base key.

-- name: cache_put
INSERT INTO rq_cache (key, base_key, value, version, source_namespace, source_key, written_at,
                      expires_at)
VALUES (:key, :base_key, :value, :version, :source_namespace, :source_key, :now, :expires_at)
ON CONFLICT (key) DO UPDATE
SET value = excluded.value, version = excluded.version,
    source_namespace = excluded.source_namespace, source_key = excluded.source_key,
    written_at = excluded.written_at, expires_at = excluded.expires_at;

-- name: cache_get
SELECT * FROM rq_cache
WHERE key = :key AND (expires_at IS NULL OR expires_at > :now);

-- name: cache_latest
SELECT * FROM rq_cache
WHERE base_key = :base_key AND (expires_at IS NULL OR expires_at > :now)
ORDER BY written_at DESC, key DESC
LIMIT 1;

-- name: cache_delete_base
DELETE FROM rq_cache WHERE base_key = :base_key;

-- name: cache_delete_source
DELETE FROM rq_cache WHERE source_namespace = :namespace AND source_key = :key;
