-- 0013 the ledger tier in day partitions: PostgreSQL only, nothing to do on SQLite.
--
-- On PostgreSQL (its 0013) gc writes a job's ledger tier into rq_trace_ledger, partitioned
-- by the day the job's ledger tier ends, and drops a day's partition instead of deleting
-- its rows. SQLite has no partitioned tables, and a separate table per day would turn
-- every trace read into a union over a changing set of tables; here gc keeps trimming the
-- ledger in place in rq_trace and deleting expired jobs in bounded batches, followed by
-- `PRAGMA incremental_vacuum` (docs/operations.md).
SELECT 1;
