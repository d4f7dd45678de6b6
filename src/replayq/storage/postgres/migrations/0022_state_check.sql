-- 0022 rq_jobs' state CHECK as comparisons: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0022) the CHECK's IN list was a temporary index built again for every
-- row written; the same condition as ORed comparisons is evaluated in place. PostgreSQL
-- evaluates the IN list in place already: nothing changes here.
SELECT 1;
