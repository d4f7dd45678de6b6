-- 0020 job.enqueued packs written by a trigger: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0020) the insert of a job's row writes its job.enqueued pack, so an
-- enqueue is one statement. On PostgreSQL it already is: the row and its pack are one
-- statement (PostgresTransaction._job_enqueue_one).
SELECT 1;
