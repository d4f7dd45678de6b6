-- 0013 the ledger tier in day partitions: expiring a day drops a partition.
--
-- When gc moves a job to its ledger tier (queue/retention.py) it writes the packs it keeps
-- into rq_trace_ledger, partitioned by range of the job's expiry time (finished_at +
-- ledger_days of its type), one partition a day (rq_trace_ledger_YYYYMMDD, made by gc
-- before it writes there: rq_trace_ledger_partition). A job's packs keep their ids, so
-- event ids (pack id * 1024 + place) and the resource index entries' pack_id stay unique
-- across both tables; the index entries of ledger packs are partitioned the same way
-- (rq_trace_ledger_resources), so they go with their day. Once a day has ended and gc has
-- deleted every job whose packs are in its partition (a held job is not deleted; a pinned
-- job's packs were moved back into rq_trace by `replayq keep`), rq_trace_ledger_drop drops
-- the two partitions of that day: no row of the trace is deleted.
--
-- The full tier stays in rq_trace, unpartitioned: packs carry their commit's time, not the
-- job's expiry, and the full -> ledger step rewrites them anyway. Nothing is copied by this
-- migration: a job trimmed in place before it moves on the next gc pass.
-- SQLite has no partitions (its 0013 says why); these tables are PostgreSQL's alone
-- (tests/migration/test_schema_backends.py names them).

CREATE TABLE rq_trace_ledger (
    id         BIGINT  NOT NULL,
    trace_id   TEXT    NOT NULL,
    job_id     BIGINT  NOT NULL,
    attempt    INTEGER,
    worker_id  TEXT,
    hlc        BIGINT  NOT NULL,
    hlc_last   BIGINT  NOT NULL,
    ts         DOUBLE PRECISION NOT NULL,
    events     TEXT    NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (id, expires_at)
) PARTITION BY RANGE (expires_at);

-- trace_for_job and its kin: one probe per partition (one partition a day of ledger_days).
CREATE INDEX rq_trace_ledger_job ON rq_trace_ledger (job_id, id);
-- trace_window and signal_series.
CREATE INDEX rq_trace_ledger_hlc ON rq_trace_ledger (hlc_last);

CREATE TABLE rq_trace_ledger_resources (
    resource   TEXT   COLLATE "C" NOT NULL,
    hlc        BIGINT NOT NULL,
    pack_id    BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (resource, hlc, pack_id, expires_at)
) PARTITION BY RANGE (expires_at);

-- The partitions of the UTC day holding ``expires_at``, made if missing; whether it made
-- them. Serialised per schema, so two gc passes never race to make the same day.
CREATE FUNCTION rq_trace_ledger_partition(expires_at double precision) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    day_start double precision := floor(expires_at / 86400) * 86400;
    suffix text := to_char(to_timestamp(day_start) AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('replayq.ledger:' || current_schema()));
    IF to_regclass('rq_trace_ledger_' || suffix) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF rq_trace_ledger FOR VALUES FROM (%s) TO (%s)',
                   'rq_trace_ledger_' || suffix, day_start, day_start + 86400);
    EXECUTE format('CREATE TABLE %I PARTITION OF rq_trace_ledger_resources '
                   'FOR VALUES FROM (%s) TO (%s)',
                   'rq_trace_ledger_resources_' || suffix, day_start, day_start + 86400);
    RETURN true;
END;
$$;

-- Drop the partitions of each day that ended before ``now`` and none of whose packs
-- belongs to a job still there; how many days it dropped.
CREATE FUNCTION rq_trace_ledger_drop(now double precision) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    busy boolean;
    dropped integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('replayq.ledger:' || current_schema()));
    FOR part IN
        SELECT c.relname AS name, substr(c.relname, length('rq_trace_ledger_') + 1) AS day
        FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'rq_trace_ledger'::regclass
        ORDER BY c.relname
    LOOP
        CONTINUE WHEN extract(epoch FROM to_date(part.day, 'YYYYMMDD')) + 86400 > now;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I AS p JOIN rq_jobs AS j ON j.id = p.job_id)',
                       part.name) INTO busy;
        CONTINUE WHEN busy;
        EXECUTE format('DROP TABLE %I, %I', part.name, 'rq_trace_ledger_resources_' || part.day);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END;
$$;

-- Every reader of the trace sees both tables.
CREATE OR REPLACE VIEW rq_events AS
SELECT p.id * 1024 + e.pos - 1 AS id,
       p.trace_id AS trace_id,
       p.job_id AS job_id,
       p.attempt AS attempt,
       COALESCE(e.ev ->> 'k', 'domain') AS kind,
       e.ev ->> 'n' AS name,
       (e.ev ->> 'q')::integer AS seq,
       e.ev ->> 's' AS step,
       p.ts + COALESCE((e.ev ->> 'dt')::bigint, 0) / 1e6::float8 AS ts,
       p.hlc + COALESCE((e.ev ->> 'h')::bigint, 0) AS hlc,
       p.worker_id AS worker_id,
       e.ev ->> 'st' AS status,
       e.ev ->> 'r' AS resource,
       (e.ev ->> 'v')::bigint AS resource_version,
       COALESCE((e.ev ->> 'x')::integer, 0) AS side_effect,
       e.ev ->> 'i' AS input_ref,
       e.ev ->> 'o' AS output_ref,
       COALESCE((e.ev -> 'd')::text, '{}') AS data,
       p.hlc AS pack_hlc,
       p.hlc_last AS pack_hlc_last
FROM (SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events FROM rq_trace
      UNION ALL
      SELECT id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events
      FROM rq_trace_ledger) AS p
CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) WITH ORDINALITY AS e(ev, pos);
