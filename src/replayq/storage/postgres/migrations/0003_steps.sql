-- 0003 steps: the step ledger. One row per step (by position) of a job that
-- committed, written in the step's own transaction, so that a retry can return
-- the step's recorded result instead of running it again (contract resume="step").

CREATE TABLE rq_steps (
    job_id       BIGINT  NOT NULL,
    step_key     TEXT    NOT NULL,
    step_name    TEXT    NOT NULL,
    attempt      BIGINT  NOT NULL,
    trace_id     TEXT    NOT NULL,
    result       TEXT,
    result_ref   TEXT,
    completed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, step_key)
);
