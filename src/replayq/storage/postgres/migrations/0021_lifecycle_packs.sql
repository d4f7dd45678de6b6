-- 0021 compact lifecycle packs: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0021) a pack of one lifecycle event of a known shape (a lease's job.leased,
-- an ack's job.succeeded) is stored as the values of its event's data (pack format 4)
-- instead of deflated. PostgreSQL keeps every pack as JSON text (format 1), read by jsonb
-- functions any client has.
SELECT 1;
