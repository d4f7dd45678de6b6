-- 0024 gc keeps a ledger day whose partition the owner's objects depend on, and names it.
--
-- rq_trace_ledger_drop dropped every expired day in one statement: a view of the owner's
-- over one day's partition made that DROP TABLE fail, and with it the drop of every other
-- expired day, on every gc pass after. rq_trace_ledger_drop_days drops each day on its
-- own (a subtransaction); a day the owner's objects depend on is kept and returned with
-- the server's detail (what depends on it), for gc to report. gc never drops the owner's
-- objects (no CASCADE). At most max_days days are looked at per call (each one a
-- subtransaction: past 64 in one transaction the server's cache of them overflows); the
-- call returns the last partition it looked at, and gc calls again after it until
-- `last` is NULL. Only partitions named as gc names them (rq_trace_ledger_YYYYMMDD).
--
-- A new name, the old function dropped: privileges, settings or a comment an owner gave
-- rq_trace_ledger_drop are not carried over (it was never an interface).
DROP FUNCTION rq_trace_ledger_drop(double precision);

CREATE FUNCTION rq_trace_ledger_drop_days(
    now double precision, after text, max_days integer,
    OUT dropped integer, OUT kept text[], OUT last text
)
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    busy boolean;
    why text;
    looked integer := 0;
BEGIN
    dropped := 0;
    kept := ARRAY[]::text[];
    last := NULL;
    PERFORM pg_advisory_xact_lock(hashtext('replayq.ledger:' || current_schema()));
    FOR part IN
        SELECT c.relname AS name, substr(c.relname, length('rq_trace_ledger_') + 1) AS day
        FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'rq_trace_ledger'::regclass
          AND c.relname ~ '^rq_trace_ledger_[0-9]{8}$'
          AND c.relname > after
        ORDER BY c.relname
    LOOP
        CONTINUE WHEN extract(epoch FROM to_date(part.day, 'YYYYMMDD')) + 86400 > now;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I AS p JOIN rq_jobs AS j ON j.id = p.job_id)',
                       part.name) INTO busy;
        CONTINUE WHEN busy;
        IF looked = max_days THEN
            RETURN;  -- ``last``: where the next call starts
        END IF;
        looked := looked + 1;
        last := part.name;
        BEGIN
            EXECUTE format('DROP TABLE %I, %I', part.name, 'rq_trace_ledger_resources_' || part.day);
            dropped := dropped + 1;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
            kept := kept || (part.name || ': ' || replace(coalesce(why, 'depended on'), E'\n', '; '));
        END;
    END LOOP;
    last := NULL;  -- the list ended
END;
$$;
