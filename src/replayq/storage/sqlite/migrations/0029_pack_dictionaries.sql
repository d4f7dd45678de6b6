-- 0029 learned trace pack dictionaries (issue 11).
--
-- A trace pack deflates against DICTIONARY_2 (storage/packs.py, format 2): replayq's own
-- keys and event names. The names an application gives (its steps, calls, effect kinds,
-- resource namespaces, the keys of its requests and answers) it paid for again in every
-- pack. A worker learns, once per job type, a text of those names from a succeeded
-- attempt of the type (values replaced by placeholders: storage/pack_dictionaries.py)
-- and keeps it here; later packs of the type's attempts are format 5, deflated against
-- DICTIONARY_2 followed by this text, and name the row by its id.
--
-- A row is never changed or deleted: packs name it. One row a job type (the first
-- learned is every process's); job_id is the job it was learned from (not a foreign key:
-- gc deletes jobs).
CREATE TABLE rq_pack_dictionaries (
    id         INTEGER PRIMARY KEY,
    job_type   TEXT    NOT NULL UNIQUE,
    text       BLOB    NOT NULL,
    job_id     INTEGER,
    learned_at REAL    NOT NULL
);
