-- 0014 one index page less per enqueue: rq_jobs_type (job_type) goes.
--
-- Every query that filters or groups by job type (job_reroute, version_outcomes,
-- job_durations, job_stats, signal_counts, dedup's job_by_message_id) is served by the
-- head of the unique rq_jobs_message (job_type, message_id), which holds every job (a
-- NULL message_id is an entry too); the plans are checked by
-- tests/conformance/test_query_plans.py. Each enqueue wrote a page of the dropped index
-- (~1 of the ~9.7 WAL pages an enqueue wrote; docs/benchmarks.md).
DROP INDEX IF EXISTS rq_jobs_type;
