-- 0015 plans that stay good as history grows: a job's idempotency records and outbox
-- messages are found by job id. gc's `idem_purge` deletes the settled records of one batch
-- of jobs, and `trace show` lists a job's records and messages (`idem_by_job`,
-- `outbox_by_job`); without these indexes each read the whole table, so a gc pass over a
-- large history was quadratic. One index entry per effect claim and per outbox message is
-- the price. Checked by tests/conformance/test_query_plans.py.
CREATE INDEX rq_idempotency_job ON rq_idempotency (job_id);
CREATE INDEX rq_outbox_job ON rq_outbox (job_id);
