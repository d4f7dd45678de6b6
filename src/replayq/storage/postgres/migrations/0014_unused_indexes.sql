-- 0014 indexes that do not pay: each was written by every job and read by no query.
--
-- rq_jobs_type (job_type): every query that filters by job type (job_reroute,
-- version_outcomes, job_durations, dedup's job_by_message_id) is served by the head of
-- the unique rq_jobs_message (job_type, message_id), which holds every job.
--
-- rq_jobs_finished (finished_at) WHERE finished_at IS NOT NULL: no query's plan reads it,
-- before or after ANALYZE, at 120,000 jobs of history (gc's gc_candidates walks from its
-- cursor by id). Every job entered it when it finished.
--
-- The same two go on SQLite (its 0014); plans checked by tests/conformance/test_query_plans.py.
DROP INDEX IF EXISTS rq_jobs_type;
DROP INDEX IF EXISTS rq_jobs_finished;
