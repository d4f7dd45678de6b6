-- 0024 gc keeps a ledger day whose partition the owner's objects depend on, and names it.
--
-- rq_trace_ledger_drop dropped every expired day in one statement: a view of the owner's
-- over one day's partition made that DROP TABLE fail, and with it the drop of every other
-- expired day, on every gc pass after. Each day is now dropped on its own (a
-- subtransaction); a day the owner's objects depend on is kept and returned with the
-- server's detail (what depends on it), for gc to report. gc never drops the owner's
-- objects (no CASCADE).
DROP FUNCTION rq_trace_ledger_drop(double precision);

CREATE FUNCTION rq_trace_ledger_drop(now double precision, OUT dropped integer, OUT kept text[])
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    busy boolean;
    why text;
BEGIN
    dropped := 0;
    kept := ARRAY[]::text[];
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
        BEGIN
            EXECUTE format('DROP TABLE %I, %I', part.name, 'rq_trace_ledger_resources_' || part.day);
            dropped := dropped + 1;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
            kept := kept || (part.name || ': ' || replace(why, E'\n', '; '));
        END;
    END LOOP;
END;
$$;
