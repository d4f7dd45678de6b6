-- 0016 trace packs deflated: SQLite only, nothing to do on PostgreSQL.
--
-- On SQLite (its 0016) new packs store their events deflated with a preset dictionary,
-- read in SQL through a function replayq registers on its connections. PostgreSQL keeps
-- the packs as JSON text: its rq_events view, trace windows and gc read them with
-- jsonb functions any client has, and TOAST already compresses a row past ~2 KB.
SELECT 1;
