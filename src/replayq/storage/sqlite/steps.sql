-- The step ledger: steps of a job that committed, and the result each returned.

-- name: step_complete
-- Written in the step's transaction. The first completion of a position wins: a
-- re-run of the same step (resume off, or a with-block) never replaces it.
INSERT INTO rq_steps (job_id, step_key, step_name, attempt, trace_id, result, result_ref,
                      completed_at)
VALUES (:job_id, :step_key, :step_name, :attempt, :trace_id, :result, :result_ref, :now)
ON CONFLICT (job_id, step_key) DO NOTHING;

-- name: step_by_job
SELECT * FROM rq_steps WHERE job_id = :job_id ORDER BY attempt, completed_at;
