-- 0028 a job's state versions and idempotency records keep no copy of its trace id:
-- SQLite only; here, the two views SQL of a user's own reads on either backend.
--
-- On SQLite (its 0028) a row written in its job's own trace stores NULL for its trace id
-- and is read with the job's, through the views rq_entity_versions_read and
-- rq_idempotency_read. PostgreSQL stores every row's trace id as before; its views of the
-- same names read the tables as they are, so that a query written against the views
-- answers the same on both backends (the storage verbs' answers are the same already).
CREATE VIEW rq_entity_versions_read AS
SELECT branch, namespace, key, version, parent_version, data, data_ref, delta, job_id,
       trace_id, attempt, fencing_token, created_at, hlc
FROM rq_entity_versions;

CREATE VIEW rq_idempotency_read AS
SELECT key, operation, status, result, result_ref, error, claim_token, started_at,
       completed_at, trace_id, job_id, attempt
FROM rq_idempotency;
