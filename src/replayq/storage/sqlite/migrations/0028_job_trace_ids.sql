-- 0028 a job's state versions and idempotency records keep no copy of its trace id.
--
-- rq_entity_versions and rq_idempotency carried the trace id (32 hex characters) of the
-- attempt that wrote each row beside its job_id; for a job's own writes that is the job's
-- trace id, already in rq_jobs. The traced job of context_overhead.py wrote it three times
-- (two versions and one effect record): ~100 of its ~2,950 bytes stored (issue 11).
-- From now on a row written in its job's own trace stores NULL there, and every read
-- (state.sql, effects.sql) answers its job's trace id, looked up in rq_jobs by primary key.
-- Stored as before: a trace id that is not its job's (a dry-run's or fork's derived trace,
-- a rollback's) and any of a row with no job. A row with a job and no trace id stores X''
-- (a zero-length blob, never a trace id), read as NULL.
--
-- gc deletes jobs and keeps their state versions (and their records still in doubt): the
-- trigger below writes a deleted job's trace id into its rows that stored none, in the
-- same statement, so that they answer it ever after. It seeks rq_entity_versions_job and
-- rq_idempotency_job by the job's id. A migration that copies rq_jobs into a new table
-- creates this trigger again (DROP TABLE drops it), after the rows are copied.
CREATE TRIGGER rq_jobs_trace_ids AFTER DELETE ON rq_jobs
BEGIN
    UPDATE rq_entity_versions SET trace_id = OLD.trace_id
    WHERE job_id = OLD.id AND trace_id IS NULL;
    UPDATE rq_idempotency SET trace_id = OLD.trace_id
    WHERE job_id = OLD.id AND trace_id IS NULL;
END;

-- Rows written before keep their trace ids, read as they were (a stored one is answered as
-- stored); those with a job and none become X'', so that they still answer none.
UPDATE rq_entity_versions SET trace_id = X'' WHERE trace_id IS NULL AND job_id IS NOT NULL;
UPDATE rq_idempotency SET trace_id = X'' WHERE trace_id IS NULL AND job_id IS NOT NULL;
