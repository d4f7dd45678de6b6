-- 0009 trace packs: one row per commit (per job or trace) holding that commit's events.
-- A traced job recorded ~20 rows of rq_events, each repeating its trace_id, job_id,
-- attempt and worker_id and paying its index entries. Now each transaction's events of
-- one job attempt are one rq_trace row: the common fields once, the events as a compact
-- JSON array (short keys, absent fields left out, each event's HLC and time as offsets
-- from the row's first: the time in whole microseconds). rq_trace_resources is the index of the resources the events name
-- (one entry per pack and resource). rq_events stays as a view with the old columns, so
-- the queries that count or filter events by name read it as before.
-- Each index and the query it serves: docs/recording-context.md, checked by
-- tests/conformance/test_trace_indexes.py (EXPLAIN on both backends).

CREATE TABLE rq_trace (
    id        INTEGER PRIMARY KEY,
    trace_id  TEXT    NOT NULL,
    job_id    INTEGER,
    attempt   INTEGER,
    worker_id TEXT,
    hlc       INTEGER NOT NULL,
    hlc_last  INTEGER NOT NULL,
    ts        REAL    NOT NULL,
    events    TEXT    NOT NULL
);

-- trace_for_job (`replayq trace show JOB`, a job's attempts, dry-run's recording).
CREATE INDEX rq_trace_job ON rq_trace (job_id, id);
-- trace_for_trace of a derived trace (dry-run, fork, rerun: job_id NULL).
CREATE INDEX rq_trace_derived ON rq_trace (trace_id, id) WHERE job_id IS NULL;
-- trace_window and signal_series (`replayq events --since`, `signals --by`): a pack
-- holds events whose HLC lies in [hlc, hlc_last], found by its last.
CREATE INDEX rq_trace_hlc ON rq_trace (hlc_last);

-- trace_for_resource (`replayq trace resource`, the web's resource timeline).
CREATE TABLE rq_trace_resources (
    resource TEXT    NOT NULL,
    hlc      INTEGER NOT NULL,
    pack_id  INTEGER NOT NULL,
    PRIMARY KEY (resource, hlc, pack_id)
) WITHOUT ROWID;

-- The recorded events, one pack each (ids kept, so the order is unchanged).
INSERT INTO rq_trace (id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc, ts,
       json_array(json_object(
           'n', name, 'k', kind, 'q', seq, 's', step, 'st', status, 'r', resource,
           'v', resource_version, 'x', side_effect, 'i', input_ref, 'o', output_ref,
           'd', json(data)))
FROM rq_events;

INSERT INTO rq_trace_resources (resource, hlc, pack_id)
SELECT resource, hlc, id FROM rq_events WHERE resource IS NOT NULL;

DROP TABLE rq_events;

-- One row per event, with the columns rq_events had. An event's id is its pack's id
-- times 1024 plus its place in the pack (a pack holds at most 1024 events).
CREATE VIEW rq_events AS
SELECT p.id * 1024 + e.key AS id,
       p.trace_id AS trace_id,
       p.job_id AS job_id,
       p.attempt AS attempt,
       COALESCE(json_extract(e.value, '$.k'), 'domain') AS kind,
       json_extract(e.value, '$.n') AS name,
       json_extract(e.value, '$.q') AS seq,
       json_extract(e.value, '$.s') AS step,
       p.ts + COALESCE(json_extract(e.value, '$.dt'), 0) / 1e6 AS ts,
       p.hlc + COALESCE(json_extract(e.value, '$.h'), 0) AS hlc,
       p.worker_id AS worker_id,
       json_extract(e.value, '$.st') AS status,
       json_extract(e.value, '$.r') AS resource,
       json_extract(e.value, '$.v') AS resource_version,
       COALESCE(json_extract(e.value, '$.x'), 0) AS side_effect,
       json_extract(e.value, '$.i') AS input_ref,
       json_extract(e.value, '$.o') AS output_ref,
       COALESCE(json_extract(e.value, '$.d'), '{}') AS data,
       p.hlc AS pack_hlc,
       p.hlc_last AS pack_hlc_last
FROM rq_trace AS p, json_each(p.events) AS e;
