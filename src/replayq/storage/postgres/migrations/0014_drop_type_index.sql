-- 0014 rq_jobs_type (job_type) goes: the head of the unique rq_jobs_message
-- (job_type, message_id), which holds every job, serves every query that filters by job
-- type (job_reroute, version_outcomes, job_durations, dedup's job_by_message_id; checked
-- by tests/conformance/test_query_plans.py), and each insert paid for both.
DROP INDEX IF EXISTS rq_jobs_type;
