-- PostgreSQL-only plumbing: migration locking, what an owner hung on a relation a migration
-- drops (storage/postgres/upgrade.py), and the LISTEN side of wake-ups.

-- name: migrations_lock
-- Two workers starting at once: the second waits here, then finds nothing pending.
-- Keyed on the schema so separate schemas (one per test, one per tenant) do not queue.
SELECT pg_advisory_xact_lock(hashtext('replayq.migrate:' || current_schema()));

-- name: migration_dependents
-- What hangs on the relations a migration drops (``relations``, resolved through the
-- search path as the script resolves them), to tell replayq's objects from the owner's.
-- The relation's own indexes (not a constraint's), triggers and rules go with it without
-- a word: each comes with the SQL that makes it again (a trigger or rule disabled, or
-- enabled for replicas, as it was; its comment) and the kind of relation it was on.
-- So do the privileges granted on it, given again on what takes its name (whatever its
-- kind), and the values of a table's columns that the relation taking its name has not. Its policies and statistics objects go too, and cannot be made again here (definition
-- NULL). What other objects read it or reference it (a view, a rule, a foreign key, a
-- function's body) makes PostgreSQL refuse the drop, or goes along with CASCADE (``NULL``
-- too). ``dropped`` says how to drop each, for the owner's part of the refusal.
WITH dropped AS (
    SELECT c.oid, c.oid::regclass::text AS relation,
           CASE c.relkind WHEN 'p' THEN 'r' ELSE c.relkind END AS relkind,
           n.nspname AS schema, c.relname
    FROM unnest(%(relations)s::text[]) AS r (name)
    JOIN pg_class AS c ON c.oid = to_regclass(r.name)
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
)
SELECT 'index' AS kind, i.relname AS name, d.relation, d.relkind, d.schema, d.relname,
       pg_get_indexdef(i.oid) || COALESCE(format('; COMMENT ON INDEX %%I.%%I IS ', d.schema,
           i.relname) || quote_literal(obj_description(i.oid, 'pg_class')), '') AS definition,
       format('DROP INDEX %%s', i.oid::regclass) AS dropped
FROM dropped AS d
JOIN pg_index AS x ON x.indrelid = d.oid
JOIN pg_class AS i ON i.oid = x.indexrelid
WHERE NOT EXISTS (SELECT FROM pg_constraint AS k WHERE k.conindid = i.oid AND k.conrelid = d.oid)
UNION ALL
SELECT o.kind, o.name, d.relation, d.relkind, d.schema, d.relname,
       o.definition
       || CASE o.enabled WHEN 'O' THEN ''
              ELSE format('; ALTER TABLE %%I.%%I %%s %%s %%I', d.schema, d.relname,
                          CASE o.enabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA'
                              ELSE 'ENABLE ALWAYS' END, upper(o.kind), o.name) END
       || COALESCE(format('; COMMENT ON %%s %%I ON %%I.%%I IS ', upper(o.kind), o.name,
                          d.schema, d.relname) || quote_literal(o.comment), ''),
       format('DROP %%s %%I ON %%s', upper(o.kind), o.name, d.relation)
FROM dropped AS d
JOIN (SELECT 'trigger' AS kind, tgname AS name, tgrelid AS relid, pg_get_triggerdef(oid)
             AS definition, tgenabled AS enabled, obj_description(oid, 'pg_trigger') AS comment
      FROM pg_trigger WHERE NOT tgisinternal
      UNION ALL
      SELECT 'rule', rulename, ev_class, pg_get_ruledef(oid), ev_enabled,
             obj_description(oid, 'pg_rewrite')
      FROM pg_rewrite WHERE rulename <> '_RETURN') AS o ON o.relid = d.oid
UNION ALL
-- The privileges granted on it (to roles other than its owner), granted again on what
-- takes its name: a GRANT given twice changes nothing.
SELECT 'privileges', string_agg(DISTINCT g.grantee, ', '), d.relation, d.relkind, d.schema,
       d.relname,
       string_agg(format('GRANT %%s ON %%I.%%I TO %%s%%s', g.privilege_type, d.schema,
                         d.relname, g.grantee,
                         CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END), '; '),
       format('REVOKE ALL ON %%s FROM %%s', d.relation, string_agg(DISTINCT g.grantee, ', '))
FROM dropped AS d
JOIN pg_class AS c ON c.oid = d.oid
CROSS JOIN LATERAL (
    SELECT a.privilege_type, a.is_grantable,
           CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
    FROM aclexplode(c.relacl) AS a
    WHERE a.grantee <> c.relowner
) AS g
GROUP BY d.relation, d.relkind, d.schema, d.relname
UNION ALL
-- The columns of a dropped table: the copy takes those the migration knows.
SELECT 'column', a.attname, d.relation, d.relkind, d.schema, d.relname, '',
       format('ALTER TABLE %%s DROP COLUMN %%I', d.relation, a.attname)
FROM dropped AS d
JOIN pg_attribute AS a ON a.attrelid = d.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE d.relkind = 'r'
UNION ALL
SELECT 'policy', p.polname, d.relation, d.relkind, d.schema, d.relname,
       NULL, format('DROP POLICY %%I ON %%s', p.polname, d.relation)
FROM dropped AS d
JOIN pg_policy AS p ON p.polrelid = d.oid
UNION ALL
SELECT 'statistics object', s.stxname, d.relation, d.relkind, d.schema, d.relname,
       NULL, format('DROP STATISTICS %%I.%%I', s.stxnamespace::regnamespace, s.stxname)
FROM dropped AS d
JOIN pg_statistic_ext AS s ON s.stxrelid = d.oid
UNION ALL
SELECT DISTINCT
       CASE v.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
           ELSE COALESCE(CASE WHEN r.oid IS NOT NULL THEN 'rule' END,
                         CASE WHEN k.oid IS NOT NULL THEN 'constraint' END, 'object') END,
       COALESCE(v.relname, k.conname, pg_describe_object(e.classid, e.objid, e.objsubid)),
       d.relation, d.relkind, d.schema, d.relname, NULL,
       CASE WHEN v.relkind = 'v' THEN format('DROP VIEW %%s', v.oid::regclass)
            WHEN v.relkind = 'm' THEN format('DROP MATERIALIZED VIEW %%s', v.oid::regclass)
            WHEN r.oid IS NOT NULL THEN format('DROP RULE %%I ON %%s', r.rulename, v.oid::regclass)
            WHEN k.oid IS NOT NULL
                THEN format('ALTER TABLE %%s DROP CONSTRAINT %%I', k.conrelid::regclass, k.conname)
            ELSE 'DROP ' || pg_describe_object(e.classid, e.objid, e.objsubid) END
FROM dropped AS d
JOIN pg_depend AS e ON e.refclassid = 'pg_class'::regclass AND e.refobjid = d.oid
    AND e.deptype = 'n'
LEFT JOIN pg_rewrite AS r ON e.classid = 'pg_rewrite'::regclass AND r.oid = e.objid
LEFT JOIN pg_class AS v ON v.oid = r.ev_class
LEFT JOIN pg_constraint AS k ON e.classid = 'pg_constraint'::regclass AND k.oid = e.objid
WHERE NOT EXISTS (SELECT FROM dropped AS o WHERE o.oid = COALESCE(r.ev_class, k.conrelid));

-- name: migration_dependent_kept
-- After the script: whether an index, trigger or rule of ``migration_dependents`` is still
-- there (the script did not drop it after all), and the kind of the relation now named as
-- the one it was on (NULL if there is none).
WITH relation AS (
    SELECT c.oid, CASE c.relkind WHEN 'p' THEN 'r' ELSE c.relkind END AS relkind
    FROM pg_class AS c
    WHERE c.oid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(%(relname)s))
)
SELECT (SELECT relkind FROM relation) AS relkind,
       CASE %(kind)s
           WHEN 'index' THEN to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(%(name)s))
               IS NOT NULL
           WHEN 'trigger' THEN EXISTS (SELECT FROM pg_trigger AS t JOIN relation AS r
                                       ON t.tgrelid = r.oid WHERE t.tgname = %(name)s)
           WHEN 'rule' THEN EXISTS (SELECT FROM pg_rewrite AS w JOIN relation AS r
                                    ON w.ev_class = r.oid WHERE w.rulename = %(name)s)
           WHEN 'column' THEN EXISTS (SELECT FROM pg_attribute AS a JOIN relation AS r
                                      ON a.attrelid = r.oid WHERE a.attname = %(name)s
                                      AND NOT a.attisdropped)
           ELSE false
       END AS present;

-- name: jobs_listen
LISTEN replayq_jobs;

-- name: jobs_listen_installation
-- Which installation's wake-ups this listener wants: its rq_jobs table, as the notifying
-- statements name it (NULL before the schema exists: then every wake-up is heard).
SELECT to_regclass('rq_jobs')::oid::bigint AS installation;

-- name: listen_health
-- The listener's liveness probe: a half-open socket raises nothing until it is used.
SELECT 1;
