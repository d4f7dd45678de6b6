-- Versioned copy-on-write state. A write is a compare-and-set on the head version.
-- PostgreSQL flavour of storage/sqlite/state.sql: same query names and parameters.

-- name: entity_head
SELECT version, hlc FROM rq_entities
WHERE branch = %(branch)s AND namespace = %(namespace)s AND key = %(key)s;

-- name: entity_version_get
SELECT * FROM rq_entity_versions
WHERE branch = %(branch)s AND namespace = %(namespace)s AND key = %(key)s AND version = %(version)s;

-- name: entity_head_version
-- entity_head, then entity_version_get of the version it names, as one statement (one
-- snapshot, one round trip): an entity's current version (its HLC is the head's).
SELECT v.* FROM rq_entities AS h
JOIN rq_entity_versions AS v
  ON v.branch = h.branch AND v.namespace = h.namespace AND v.key = h.key
 AND v.version = h.version
WHERE h.branch = %(branch)s AND h.namespace = %(namespace)s AND h.key = %(key)s;

-- name: entity_version_at
-- The newest version of an entity on a branch written at or before an HLC point.
SELECT * FROM rq_entity_versions
WHERE branch = %(branch)s AND namespace = %(namespace)s AND key = %(key)s AND hlc <= %(hlc)s
ORDER BY version DESC
LIMIT 1;

-- name: entity_head_insert
INSERT INTO rq_entities (branch, namespace, key, version, hlc)
VALUES (%(branch)s, %(namespace)s, %(key)s, %(new_version)s, %(hlc)s)
ON CONFLICT (branch, namespace, key) DO NOTHING;

-- name: entity_head_put
-- A branch's head of an entity in one statement (``branch_head_put`` in a commit in one
-- round trip, sent as entity_head_put_refusing only): started if the branch has none (it
-- read the entity through to its base until now), else moved from :expected_version. The
-- same answer as looking the head up first and then entity_head_insert or entity_head_cas:
-- inserted where there was no head, moved where it was at :expected_version (a head is
-- never at version 0, so with :expected_version 0 an existing one is never moved), else
-- no row changed. A concurrent insert of the head is waited for and then compared.
INSERT INTO rq_entities (branch, namespace, key, version, hlc)
VALUES (%(branch)s, %(namespace)s, %(key)s, %(new_version)s, %(hlc)s)
ON CONFLICT (branch, namespace, key) DO UPDATE
SET version = excluded.version, hlc = excluded.hlc
WHERE rq_entities.version = %(expected_version)s;

-- name: entity_head_create
-- The head of an entity on a branch being created (``branch_create`` with versions): no
-- ON CONFLICT, an existing head is an error.
INSERT INTO rq_entities (branch, namespace, key, version, hlc)
VALUES (%(branch)s, %(namespace)s, %(key)s, %(version)s, %(hlc)s);

-- name: entity_head_cas
UPDATE rq_entities SET version = %(new_version)s, hlc = %(hlc)s
WHERE branch = %(branch)s AND namespace = %(namespace)s AND key = %(key)s AND version = %(expected_version)s;

-- name: entity_version_insert
INSERT INTO rq_entity_versions (branch, namespace, key, version, parent_version, data, data_ref,
                                delta, job_id, trace_id, attempt, fencing_token, created_at, hlc)
VALUES (%(branch)s, %(namespace)s, %(key)s, %(version)s, %(parent_version)s, %(data)s, %(data_ref)s, %(delta)s, %(job_id)s,
        %(trace_id)s, %(attempt)s, %(fencing_token)s, %(created_at)s, %(hlc)s);

-- name: entity_versions_by_job
SELECT * FROM rq_entity_versions WHERE job_id = %(job_id)s ORDER BY hlc, version;

-- name: entity_versions_after
SELECT * FROM rq_entity_versions
WHERE branch = %(branch)s AND namespace = %(namespace)s AND key = %(key)s AND version > %(version)s
ORDER BY version;

-- name: branch_create
INSERT INTO rq_branches (branch, base_branch, base_hlc, origin, created_at)
VALUES (%(branch)s, %(base_branch)s, %(base_hlc)s, %(origin)s, %(now)s);

-- name: branch_get
SELECT * FROM rq_branches WHERE branch = %(branch)s;
