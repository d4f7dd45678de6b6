-- Learned trace pack dictionaries (storage/pack_dictionaries.py, migration 0029).

-- name: pack_dictionary_of_type
SELECT id, text FROM rq_pack_dictionaries WHERE job_type = :job_type;

-- name: pack_dictionary_put
-- The first learned for a job type is every process's: a later one is not kept.
INSERT INTO rq_pack_dictionaries (job_type, text, job_id, learned_at)
VALUES (:job_type, :text, :job_id, :now)
ON CONFLICT (job_type) DO NOTHING;

-- name: pack_dictionary_text
SELECT text FROM rq_pack_dictionaries WHERE id = :id;
