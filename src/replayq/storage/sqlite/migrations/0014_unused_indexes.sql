-- 0014 indexes that do not pay: each was written by every job and read by no query.
--
-- rq_jobs_type (job_type): every query that filters or groups by job type (job_reroute,
-- version_outcomes, job_durations, job_stats, signal_counts, dedup's job_by_message_id)
-- is served by the head of the unique rq_jobs_message (job_type, message_id), which
-- holds every job (a NULL message_id is an entry too). One page of each enqueue's ~9.7.
--
-- rq_jobs_finished (finished_at) WHERE finished_at IS NOT NULL: no query of this backend
-- reads it. gc's gc_candidates walks finished jobs by id from its cursor (the rowid),
-- with or without statistics, and no other query bounds finished_at alone. Every job
-- enters it when it finishes: about one page of each drained job's ~8.3.
--
-- Plans checked by tests/conformance/test_query_plans.py; pages in docs/benchmarks.md.
-- The same two go on PostgreSQL (its 0014), whose plans do not read them either.
DROP INDEX IF EXISTS rq_jobs_type;
DROP INDEX IF EXISTS rq_jobs_finished;
