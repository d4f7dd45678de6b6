-- 0018 entity heads without a rowid: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0018) rq_entities becomes a WITHOUT ROWID table, stored in its primary
-- key's B-tree instead of a table beside an automatic index. PostgreSQL's heap and its
-- primary key index are as they were.
SELECT 1;
