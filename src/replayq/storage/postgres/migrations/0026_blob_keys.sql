-- 0026 rq_blobs keyed by the SHA-256's 32 bytes (bytea), not its 64 characters of hex.
--
-- The key is kept twice, in the row and in its primary key's index: as hex text it was
-- 65 bytes in each, as bytea 33 (SQLite's 0026 says why). References keep their form
-- (blob:sha256:<hex>): the verbs convert at the storage seam (storage/context_verbs.py,
-- retention_verbs.py). PostgreSQL rewrites the table and its index in place (the same
-- rows; an index or trigger of the owner's on it is rebuilt with it; a view of the
-- owner's that reads the column refuses the upgrade, naming it: upgrade.py).
ALTER TABLE rq_blobs ALTER COLUMN hash TYPE bytea USING decode(hash, 'hex');
