-- 0024 values packs: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0024) the pack of an attempt that its steps join after its lease is stored
-- as its events' values (pack format 5), appended to by each commit, instead of a deflate
-- stream. PostgreSQL keeps every pack as JSON text (format 1), read by jsonb functions any
-- client has.
SELECT 1;
