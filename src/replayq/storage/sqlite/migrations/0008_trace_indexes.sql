-- 0008 trace indexes: only the indexes the trace's queries need.
-- A job's events are found by job_id (rq_events_job: trace_for_job, `replayq trace
-- show JOB`); a job's own trace_id is found through rq_jobs_trace. Only derived traces
-- (dry-run, fork, rerun: job_id NULL) need events by trace_id, so that index covers
-- them alone: one index entry less for every event a worker records.
-- Each index and the query it serves: docs/recording-context.md, checked by
-- tests/conformance/test_trace_indexes.py (EXPLAIN on both backends).

DROP INDEX rq_events_trace;

CREATE INDEX rq_events_derived ON rq_events (trace_id, id) WHERE job_id IS NULL;
