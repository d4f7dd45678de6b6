-- 0029 learned trace pack dictionaries: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0029) packs of a job type's attempts deflate against a dictionary
-- learned from that type's own traces (rq_pack_dictionaries). PostgreSQL keeps the packs
-- as JSON text (its 0016), compressed by TOAST past ~2 KB.
SELECT 1;
