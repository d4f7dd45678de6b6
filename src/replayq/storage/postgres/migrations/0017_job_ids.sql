-- 0017 job ids without AUTOINCREMENT: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0017) rq_jobs loses AUTOINCREMENT, whose sqlite_sequence write cost a WAL
-- page per enqueue, and keeps ids from being reused by a floor instead. PostgreSQL's
-- sequence never gives a value twice and logs its values ahead in blocks, not one write
-- per insert: nothing changes here.
SELECT 1;
