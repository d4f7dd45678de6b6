-- 0019 compact job.enqueued packs: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0019) a new job's job.enqueued pack is stored as the values of its event's
-- data (pack format 3) instead of deflated. PostgreSQL keeps every pack as JSON text
-- (format 1), read by jsonb functions any client has.
SELECT 1;
