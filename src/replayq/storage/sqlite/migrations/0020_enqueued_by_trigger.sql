-- 0020 a new job's job.enqueued pack is written by the insert of its row.
--
-- Every job's first pack holds its job.enqueued event alone, built from the values the row
-- is inserted with (pack format 3, storage/packs.py: b'\x03' and the JSON array
-- [run_at, priority, message_id, ordering_key, causation_id], trailing nulls left out).
-- The trigger writes it in the statement that inserts the row, so an enqueue is one
-- statement, committed by itself (SqliteStorage.autocommit), where it was BEGIN, two
-- inserts and COMMIT. run_at is written with 17 significant digits, which give back the
-- same double for every run_at replayq accepts (|run_at| < 1e15, queue/enqueue.py); the
-- other values with json_quote. rtrim(..., ',nul') drops the trailing nulls only: the
-- text before them ends with a digit (priority) or a closing quote.
--
-- A row that ON CONFLICT skips fires nothing (a duplicate message_id writes no pack). A
-- migration that copies rq_jobs into a new table must drop this trigger first and create
-- it again after, or every copied job gets a second job.enqueued pack.
CREATE TRIGGER rq_jobs_enqueued AFTER INSERT ON rq_jobs
BEGIN
    INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
    VALUES (NEW.trace_id, NEW.id, 0, NULL, NEW.hlc, NEW.hlc, NEW.created_at,
            CAST(x'03' || '[' || rtrim(
                printf('%!.17g', NEW.run_at) || ',' || NEW.priority
                || ',' || json_quote(NEW.message_id)
                || ',' || json_quote(NEW.ordering_key)
                || ',' || json_quote(NEW.causation_id), ',nul') || ']' AS BLOB));
END;
