-- 0017 plans that stay good as history grows: gc's `idem_purge` deletes the settled
-- idempotency records of one batch of jobs by job id. Without this index each batch read
-- the whole of rq_idempotency, so a pass over a large history was quadratic. One index
-- entry per effect claim is the price; checked with gc's other batch statements by
-- tests/conformance/test_query_plans.py.
CREATE INDEX rq_idempotency_job ON rq_idempotency (job_id);
