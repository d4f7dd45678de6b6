-- 0027 rq_require: a statement that refuses in the server, for commits sent in one round
-- trip (PostgreSQL only; nothing to do on SQLite).
--
-- A pipelined commit (storage/postgres, ``pipelined(refusals=True)``) sends its
-- compare-and-sets and its fenced trace insert with ``COMMIT`` and waits once. Nothing
-- reads their row counts before ``COMMIT``, so each says itself when it did not change
-- exactly one row: ``rq_require(false, code, message)`` raises ``code`` (class ``RQ``),
-- the transaction aborts and ``COMMIT`` commits nothing. The client then does the commit
-- again the careful way (each result read before ``COMMIT``), which finds the cause (a
-- version another writer made, a lease another worker took) and says it as before.
-- VOLATILE (the default): evaluated where it stands, never folded or skipped.
CREATE FUNCTION rq_require(ok boolean, code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
    END IF;
    RETURN true;
END
$$;
