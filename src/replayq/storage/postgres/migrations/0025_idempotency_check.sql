-- 0025 rq_idempotency's status CHECK as comparisons: SQLite only, nothing to do on
-- PostgreSQL.
--
-- On SQLite (its 0025) the CHECK's IN list was a temporary index built again for every
-- row written; PostgreSQL evaluates its CHECK (status IN (...)) in place.
SELECT 1;
