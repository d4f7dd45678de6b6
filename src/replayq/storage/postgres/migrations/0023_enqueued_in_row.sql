-- 0023 job.enqueued packs kept in the job's row: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0023) a new job's job.enqueued pack is two columns of its row, read
-- through the views rq_packs and rq_events, instead of a row of rq_trace and its two
-- indexes. PostgreSQL keeps writing it to rq_trace in the statement that inserts the job.
SELECT 1;
