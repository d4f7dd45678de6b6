-- Versioned copy-on-write state. A write is a compare-and-set on the head version.
--
-- A version's trace id (migration 0028): a version written by a job in the job's own trace
-- stores none (NULL), and is read with its job's (rq_jobs.trace_id, by its primary key):
-- 33 bytes less a version row. Stored: a trace id that is not its job's (a dry-run's or
-- fork's derived trace, a rollback's), or any with no job; X'' (a zero-length blob, never a
-- trace id) for a job's version written with none. When a job is deleted (gc), the trigger
-- rq_jobs_trace_ids writes its trace id into its versions that stored none. Every read
-- below goes through the view rq_entity_versions_read (0028), which answers trace_id so:
-- the same answer as PostgreSQL's, which stores every trace id.

-- name: entity_head
SELECT version, hlc FROM rq_entities
WHERE branch = :branch AND namespace = :namespace AND key = :key;

-- name: entity_version_get
SELECT * FROM rq_entity_versions_read AS v
WHERE branch = :branch AND namespace = :namespace AND key = :key AND version = :version;

-- name: entity_head_version
-- entity_head, then entity_version_get of the version it names, as one statement: an
-- entity's current version (its HLC is the head's). One statement fewer for every read of
-- an entity that exists (ContextVerbs.entity_get); rq_entities' key, then
-- rq_entity_versions' primary key.
SELECT v.* FROM rq_entities AS h
JOIN rq_entity_versions_read AS v
  ON v.branch = h.branch AND v.namespace = h.namespace AND v.key = h.key
 AND v.version = h.version
WHERE h.branch = :branch AND h.namespace = :namespace AND h.key = :key;

-- name: entity_version_at
-- The newest version of an entity on a branch written at or before an HLC point.
SELECT * FROM rq_entity_versions_read AS v
WHERE branch = :branch AND namespace = :namespace AND key = :key AND hlc <= :hlc
ORDER BY version DESC
LIMIT 1;

-- name: entity_head_insert
INSERT INTO rq_entities (branch, namespace, key, version, hlc)
VALUES (:branch, :namespace, :key, :new_version, :hlc)
ON CONFLICT (branch, namespace, key) DO NOTHING;

-- name: entity_head_create
-- The head of an entity on a branch being created (``branch_create`` with versions): no
-- ON CONFLICT, an existing head is an error.
INSERT INTO rq_entities (branch, namespace, key, version, hlc)
VALUES (:branch, :namespace, :key, :version, :hlc);

-- name: entity_head_cas
UPDATE rq_entities SET version = :new_version, hlc = :hlc
WHERE branch = :branch AND namespace = :namespace AND key = :key AND version = :expected_version;

-- name: entity_version_insert
INSERT INTO rq_entity_versions (branch, namespace, key, version, parent_version, data, data_ref,
                                delta, job_id, trace_id, attempt, fencing_token, created_at, hlc)
VALUES (:branch, :namespace, :key, :version, :parent_version, :data, :data_ref, :delta, :job_id,
        CASE WHEN :trace_id = (SELECT j.trace_id FROM rq_jobs AS j WHERE j.id = :job_id) THEN NULL
             WHEN :trace_id IS NULL AND :job_id IS NOT NULL THEN X''
             ELSE :trace_id END,
        :attempt, :fencing_token, :created_at, :hlc);

-- name: entity_versions_by_job
SELECT * FROM rq_entity_versions_read AS v WHERE v.job_id = :job_id ORDER BY v.hlc, v.version;

-- name: entity_versions_after
SELECT * FROM rq_entity_versions_read AS v
WHERE v.branch = :branch AND v.namespace = :namespace AND v.key = :key AND v.version > :version
ORDER BY v.version;

-- name: branch_create
INSERT INTO rq_branches (branch, base_branch, base_hlc, origin, created_at)
VALUES (:branch, :base_branch, :base_hlc, :origin, :now);

-- name: branch_get
SELECT * FROM rq_branches WHERE branch = :branch;
