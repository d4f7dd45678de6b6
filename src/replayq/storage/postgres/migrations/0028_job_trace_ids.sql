-- 0028 a job's state versions and idempotency records keep no copy of its trace id:
-- SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0028) a row written in its job's own trace stores NULL for its trace id
-- and is read with the job's. PostgreSQL stores every row's trace id as before; the
-- answers of the storage verbs are the same on both.
SELECT 1;
