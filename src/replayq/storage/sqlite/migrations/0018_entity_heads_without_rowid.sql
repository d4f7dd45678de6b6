-- 0018 entity heads without a rowid: one B-tree instead of two for every state write.
--
-- rq_entities holds one small row per entity and branch (its head version and HLC), read
-- and written only by its primary key (branch, namespace, key). As a rowid table that key
-- was a second B-tree (its automatic index) beside the table's own: a head lookup walked
-- both, and a new entity's head dirtied a page of each (a WAL frame more per new entity;
-- docs/benchmarks.md, "Round 11"). WITHOUT ROWID keeps the rows in the key's B-tree
-- itself. The same columns, rows and key; nothing reads the rowid.
CREATE TABLE rq_entities_0018 (
    branch    TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    version   INTEGER NOT NULL,
    hlc       INTEGER NOT NULL,
    PRIMARY KEY (branch, namespace, key)
) WITHOUT ROWID;

INSERT INTO rq_entities_0018 (branch, namespace, key, version, hlc)
SELECT branch, namespace, key, version, hlc FROM rq_entities;

DROP TABLE rq_entities;

-- The rename in legacy mode, as in 0022: SQLite's own checks every view and trigger of
-- the schema first, and a view of the file's owner over rq_entities (dropped just above)
-- refused the whole upgrade. Legacy mode renames the table alone; such views name
-- rq_entities, which the copy is again. (Added after 0022; the tables it leaves are
-- the same, so a file that had this migration applied already is as it would be.)
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_entities_0018 RENAME TO rq_entities;

PRAGMA legacy_alter_table = OFF;
