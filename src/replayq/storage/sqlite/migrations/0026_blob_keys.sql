-- 0026 rq_blobs keyed by the SHA-256's 32 bytes, not its 64 characters of hex.
--
-- The key is kept twice, in the row and in its primary key's index: as hex text it was
-- ~65 bytes in each, as a BLOB 33 (issue 11, a traced job's bytes against the same work
-- done by hand: benchmarks/context_overhead.py). References keep their form
-- (blob:sha256:<hex>): the verbs convert at the storage seam (storage/context_verbs.py,
-- retention_verbs.py).
-- A column's type cannot be altered: the table is copied (the same columns, rows and
-- rowids; still a rowid table: a blob's body is a value too large to stay inline, past
-- what a WITHOUT ROWID table's B-tree takes well). SQLite 3.40 has no unhex(): rq_unhex
-- is the runner's (run_migration registers it; storage/sqlite/__init__.py).
-- The CHECK: a process of an earlier release still running would bind the key as its hex
-- text, a row no reader finds; it is refused instead (docs/operations.md: stop or restart
-- the workers of the earlier release before upgrading).
CREATE TABLE rq_blobs_0026 (
    hash        BLOB    PRIMARY KEY CHECK (typeof(hash) = 'blob' AND length(hash) = 32),
    codec       TEXT    NOT NULL,
    size        INTEGER NOT NULL,
    stored_size INTEGER NOT NULL,
    body        BLOB    NOT NULL,
    created_at  REAL    NOT NULL,
    used_at     REAL    NOT NULL DEFAULT 0
);

INSERT INTO rq_blobs_0026 (rowid, hash, codec, size, stored_size, body, created_at, used_at)
SELECT rowid, rq_unhex(hash), codec, size, stored_size, body, created_at, used_at
FROM rq_blobs;

DROP TABLE rq_blobs;

-- The rename in legacy mode, as in 0018, 0022 and 0025: a view of the file's owner over
-- the table dropped just above would otherwise refuse the whole upgrade.
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_blobs_0026 RENAME TO rq_blobs;

PRAGMA legacy_alter_table = OFF;
