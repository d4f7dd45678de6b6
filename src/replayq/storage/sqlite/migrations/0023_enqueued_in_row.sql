-- 0023 a new job's job.enqueued pack is kept in its row, not in rq_trace.
--
-- Since 0020 the trigger rq_jobs_enqueued wrote each new job's job.enqueued pack (format 3)
-- into rq_trace: with rq_trace's two indexes (rq_trace_job, rq_trace_hlc), three of the
-- seven b-trees an enqueue dirtied, ~3.4 of its ~8.3 WAL pages (2 KB) and ~45,000 of its
-- ~290,000 instructions (issue 13). The same bytes now go in two columns of the job's row,
-- written by job_insert itself: enqueued (the format 3 pack, built as the trigger built
-- it) and enqueued_hlc (the event's HLC; rq_jobs.hlc moves with the job's lifecycle).
-- One index, rq_jobs_enqueued_hlc, lets windows by HLC find them: an enqueue dirties five
-- b-trees (~6.1 pages, ~267,000 instructions).
--
-- Readers see the pack as before, as a row of the view rq_packs: rq_trace's packs and,
-- for each job with enqueued_hlc, its job.enqueued pack with id -(job id) (a pack's id is
-- positive: no clash, and the first of its job's packs by id). rq_events now holds every
-- event (rq_trace's and the rows'), for SQL outside replayq; replayq's own queries that join
-- events to jobs read rq_pack_events (rq_trace's events: a view over a UNION ALL cannot be
-- flattened into a join, whose plan would scan) and rq_enqueued_events (the rows') apart.
-- A job's pack goes with its row (gc deletes both; trimming keeps lifecycle events).
--
-- Jobs enqueued before keep their pack in rq_trace and NULL in both columns: nothing to
-- move, and no job has its job.enqueued twice. A migration that copies rq_jobs into a new
-- table copies both columns, or the jobs lose their job.enqueued.
DROP TRIGGER rq_jobs_enqueued;

ALTER TABLE rq_jobs ADD COLUMN enqueued_hlc INTEGER;
ALTER TABLE rq_jobs ADD COLUMN enqueued BLOB;

CREATE INDEX rq_jobs_enqueued_hlc ON rq_jobs (enqueued_hlc) WHERE enqueued_hlc IS NOT NULL;

CREATE VIEW rq_packs AS
SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace
UNION ALL
SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs WHERE enqueued_hlc IS NOT NULL;

DROP VIEW rq_events;

CREATE VIEW rq_pack_events AS
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
FROM rq_trace AS p, json_each(rq_pack_json(p.events)) AS e;

CREATE VIEW rq_enqueued_events AS
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
FROM (SELECT -id AS id, trace_id, id AS job_id, 0 AS attempt, NULL AS worker_id,
       enqueued_hlc AS hlc, enqueued_hlc AS hlc_last, created_at AS ts, enqueued AS events
FROM rq_jobs WHERE enqueued_hlc IS NOT NULL) AS p, json_each(rq_pack_json(p.events)) AS e;

CREATE VIEW rq_events AS
SELECT * FROM rq_pack_events
UNION ALL
SELECT * FROM rq_enqueued_events;
