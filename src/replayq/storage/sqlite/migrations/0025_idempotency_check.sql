-- 0025 rq_idempotency's status CHECK as comparisons, not an IN list (as 0022 did for
-- rq_jobs' state).
--
-- SQLite codes a CHECK's IN list of more than two constants as a temporary index, built
-- again (cleared, its values inserted, then searched) for every row an INSERT or an
-- UPDATE of status writes: an effect's claim (idem_claim) and its outcome (idem_succeed,
-- idem_fail) paid it once each, ~32,000 instructions a statement (SQLite 3.40.1,
-- callgrind); the traced job of context_overhead.py, one effect, ~66,000 instructions of
-- its ~4.54 million (context_instructions.py --inline). The same condition as ORed
-- comparisons is evaluated in place. It accepts exactly the same values (a NULL status is
-- refused by NOT NULL either way), so every row the old CHECK took, this one takes.
-- A CHECK cannot be altered: the table is copied (the same columns, rows, rowids and
-- index; still a rowid table: its rows hold results of up to 2 KB inline, too large for
-- a WITHOUT ROWID table's B-tree on 2 KB pages).
CREATE TABLE rq_idempotency_0025 (
    key          TEXT    PRIMARY KEY,
    operation    TEXT    NOT NULL,
    status       TEXT    NOT NULL
                 CHECK (status = 'started' OR status = 'succeeded' OR status = 'failed'
                        OR status = 'compensated'),
    result       TEXT,
    result_ref   TEXT,
    error        TEXT,
    claim_token  TEXT    NOT NULL,
    started_at   REAL    NOT NULL,
    completed_at REAL,
    trace_id     TEXT,
    job_id       INTEGER,
    attempt      INTEGER
);

INSERT INTO rq_idempotency_0025 (
    rowid, key, operation, status, result, result_ref, error, claim_token, started_at,
    completed_at, trace_id, job_id, attempt)
SELECT
    rowid, key, operation, status, result, result_ref, error, claim_token, started_at,
    completed_at, trace_id, job_id, attempt
FROM rq_idempotency;

DROP TABLE rq_idempotency;

-- The rename in legacy mode, as in 0018 and 0022: a view of the file's owner over the
-- table dropped just above would otherwise refuse the whole upgrade.
PRAGMA legacy_alter_table = ON;

ALTER TABLE rq_idempotency_0025 RENAME TO rq_idempotency;

PRAGMA legacy_alter_table = OFF;

CREATE INDEX rq_idempotency_job ON rq_idempotency (job_id);
