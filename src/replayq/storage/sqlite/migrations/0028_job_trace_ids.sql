-- 0028 a job's state versions and idempotency records keep no copy of its trace id.
--
-- rq_entity_versions and rq_idempotency carried the trace id (32 hex characters) of the
-- attempt that wrote each row beside its job_id; for a job's own writes that is the job's
-- trace id, already in rq_jobs. The traced job of context_overhead.py wrote it three times
-- (two versions and one effect record): ~100 of its ~2,950 bytes stored (issue 11).
-- From now on a row written in its job's own trace stores NULL there, and every read
-- answers its job's trace id, looked up in rq_jobs by primary key: replayq's queries
-- (state.sql, effects.sql) and SQL of a user's own read the two views below, which
-- answer every column as the table stored it before.
-- Stored as before: a trace id that is not its job's (a dry-run's or fork's derived trace,
-- a rollback's) and any of a row with no job. A row with a job and no trace id stores X''
-- (a zero-length blob, never a trace id), read as NULL.
--
-- gc deletes jobs and keeps their state versions (and their records still in doubt): the
-- trigger below writes a deleted job's trace id into its rows that stored none, in the
-- same statement, so that they answer it ever after. It seeks rq_entity_versions_job and
-- rq_idempotency_job by the job's id. A migration that copies rq_jobs into a new table
-- creates this trigger again (DROP TABLE drops it), after the rows are copied; one that
-- copies rq_jobs, rq_entity_versions or rq_idempotency drops the views below first and
-- creates them again after (as 0023 does with rq_events).
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

-- The tables as they read before 0028: trace_id is the row's own, else its job's, and none
-- for X''. SQLite flattens a view into the query that reads it: a filter on a view's
-- column seeks the table's index as it would on the table.
CREATE VIEW rq_entity_versions_read AS
SELECT v.branch, v.namespace, v.key, v.version, v.parent_version, v.data, v.data_ref, v.delta,
       v.job_id,
       CASE WHEN v.trace_id IS NULL THEN (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = v.job_id)
            WHEN typeof(v.trace_id) = 'blob' THEN NULL
            ELSE v.trace_id END AS trace_id,
       v.attempt, v.fencing_token, v.created_at, v.hlc
FROM rq_entity_versions AS v;

CREATE VIEW rq_idempotency_read AS
SELECT i.key, i.operation, i.status, i.result, i.result_ref, i.error, i.claim_token, i.started_at,
       i.completed_at,
       CASE WHEN i.trace_id IS NULL THEN (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = i.job_id)
            WHEN typeof(i.trace_id) = 'blob' THEN NULL
            ELSE i.trace_id END AS trace_id,
       i.job_id, i.attempt
FROM rq_idempotency AS i;
