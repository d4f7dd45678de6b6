-- 0012 plans that stay good as history grows: `jobs list --state dead` (the CLI, the
-- dashboard's dead-letter page, `dead requeue --type`) read dead and cancelled jobs through this
-- partial index instead of every finished job. A job enters it only when it dies or is
-- cancelled, so the hot path (queued -> running -> succeeded) never touches it.
-- Checked with the worker's queries by tests/conformance/test_query_plans.py.
CREATE INDEX rq_jobs_failed ON rq_jobs (state, id) WHERE state IN ('dead', 'cancelled');
