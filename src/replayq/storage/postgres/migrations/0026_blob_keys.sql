-- 0026 rq_blobs keyed by the SHA-256's 32 bytes (bytea), not its 64 characters of hex.
--
-- The key is kept twice, in the row and in its primary key's index: as hex text it was
-- 65 bytes in each, as bytea 33 (SQLite's 0026 says why). References keep their form
-- (blob:sha256:<hex>): the verbs convert at the storage seam (storage/context_verbs.py,
-- retention_verbs.py). PostgreSQL rewrites the table and its index in place (the same
-- rows; a plain index or a trigger of the owner's on it is rebuilt with it; a view, a
-- foreign key or an index on an expression or operator class of the owner's on the
-- column refuses the upgrade: upgrade.py). The CHECK: a process of an earlier release
-- still running would bind the key as hex text, which bytea takes as its 64 ASCII bytes,
-- a row no reader finds and gc collects; it is refused instead.
ALTER TABLE rq_blobs ALTER COLUMN hash TYPE bytea USING decode(hash, 'hex');
ALTER TABLE rq_blobs ADD CONSTRAINT rq_blobs_hash_bytes CHECK (octet_length(hash) = 32);
