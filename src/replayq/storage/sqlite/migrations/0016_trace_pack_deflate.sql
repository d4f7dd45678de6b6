-- 0016 trace packs deflated on SQLite (storage/packs.py, pack format 2).
--
-- A pack's events were JSON text; new packs are b'\x02' followed by that same JSON as raw
-- deflate with a preset dictionary of replayq's own keys and event names, ~4x smaller
-- (docs/benchmarks.md). The column keeps its declared type: SQLite stores a blob as a
-- blob in a TEXT column, and rewriting the table would copy every pack for nothing.
-- Packs written before stay JSON text and are read as they were: rq_pack_json(events)
-- returns the JSON text of a pack of either format. replayq registers that function on
-- every connection it opens; a plain sqlite3 shell does not have it, so the view below
-- answers only inside replayq (or after packs.pack_json is registered on a connection).
DROP VIEW rq_events;

-- One row per event, with the columns rq_events had (as in 0009, reading either format).
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
FROM rq_trace AS p, json_each(rq_pack_json(p.events)) AS e;
