-- The database cache: versioned keys (base:vN) plus the newest entry per base key.
-- PostgreSQL flavour of storage/sqlite/cache.sql: same query names and parameters.

-- name: cache_put
INSERT INTO rq_cache (key, base_key, value, version, source_namespace, source_key, written_at,
                      expires_at)
VALUES (%(key)s, %(base_key)s, %(value)s, %(version)s, %(source_namespace)s, %(source_key)s, %(now)s, %(expires_at)s)
ON CONFLICT (key) DO UPDATE
SET value = excluded.value, version = excluded.version,
    source_namespace = excluded.source_namespace, source_key = excluded.source_key,
    written_at = excluded.written_at, expires_at = excluded.expires_at;

-- name: cache_get
SELECT * FROM rq_cache
WHERE key = %(key)s AND (expires_at IS NULL OR expires_at > %(now)s);

-- name: cache_latest
SELECT * FROM rq_cache
WHERE base_key = %(base_key)s AND (expires_at IS NULL OR expires_at > %(now)s)
ORDER BY written_at DESC, key DESC
LIMIT 1;

-- name: cache_delete_base
DELETE FROM rq_cache WHERE base_key = %(base_key)s;

-- name: cache_delete_source
DELETE FROM rq_cache WHERE source_namespace = %(namespace)s AND source_key = %(key)s;
