"""The owner's views, triggers, indexes and foreign keys across PostgreSQL's migrations.

0009 drops the table ``rq_events`` to put a view of that name in its place. PostgreSQL
drops a table's indexes, triggers, rules and policies with it without a word, and refuses
the drop (a raw driver error, before) while a view or a foreign key of the owner's
depends on it. Each case here is a real schema (its own, through the search path) at the
version before the migration, upgraded by ``PostgresStorage.migrate`` as ``replayq db
upgrade`` runs it: the owner's object is refused by name, with what to do, and nothing
changes; an object on a table the migration copies is made again
(``upgrade.run_migration`` on a script that copies a table and remakes a view).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from replayq.errors import SchemaError
from replayq.storage import migrate
from replayq.storage.postgres import PostgresStorage, parse_postgres_url, upgrade
from tests.migration.older import PG_MIGRATIONS, migrated_before, version_named

pytestmark = pytest.mark.postgres

REPLAYQ_OWN = migrate.replayq_names([sql for _, _, sql in PG_MIGRATIONS])
LOG_FUNCTION = (
    "CREATE FUNCTION my_log() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN INSERT INTO my_log VALUES (TG_NAME); RETURN NULL; END $$"
)


@pytest.fixture
def pg(pg_schema_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the test's own schema (autocommit), with the owner's log table."""
    conninfo, _ = parse_postgres_url(pg_schema_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE my_log (what TEXT)")
        conn.execute(LOG_FUNCTION)
        yield conn


def schema_objects(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every relation, trigger, rule, policy and constraint of the schema, by name."""
    return conn.execute(
        "WITH here AS (SELECT oid, relname, relkind FROM pg_class"
        " WHERE relnamespace = current_schema()::regnamespace)"
        " SELECT 'relation', relname, relkind::text FROM here"
        " UNION ALL SELECT 'trigger', tgname, tgrelid::regclass::text FROM pg_trigger"
        " WHERE tgrelid IN (SELECT oid FROM here) AND NOT tgisinternal"
        " UNION ALL SELECT 'rule', rulename, ev_class::regclass::text FROM pg_rewrite"
        " WHERE ev_class IN (SELECT oid FROM here)"
        " UNION ALL SELECT 'policy', polname, polrelid::regclass::text FROM pg_policy"
        " WHERE polrelid IN (SELECT oid FROM here)"
        " UNION ALL SELECT 'constraint', conname, conrelid::regclass::text FROM pg_constraint"
        " WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2, 3"
    ).fetchall()


def schema_of(conn: psycopg.Connection[Any]) -> str:
    return str(conn.execute("SELECT current_schema()").fetchone()[0])


def applied(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT MAX(version) FROM rq_schema_migrations").fetchone()[0])


def upgrade_refused(url: str) -> str:
    storage = PostgresStorage(url)
    try:
        with pytest.raises(SchemaError) as refused:
            storage.migrate(now=0.0)
    finally:
        storage.close()
    return str(refused.value)


# An object of the owner's over rq_events as 0001 made it, and the statement that drops it.
ON_EVENTS = [
    pytest.param(
        "index 'my_events_by_name'",
        "CREATE INDEX my_events_by_name ON rq_events (name)",
        "DROP INDEX my_events_by_name",
        id="index",
    ),
    pytest.param(
        "trigger 'my_event_log'",
        "CREATE TRIGGER my_event_log AFTER INSERT ON rq_events"
        " FOR EACH ROW EXECUTE FUNCTION my_log()",
        "DROP TRIGGER my_event_log ON rq_events",
        id="row-trigger",
    ),
    pytest.param(
        # PostgreSQL could make this one on a view; it would never fire there.
        "trigger 'my_event_batch'",
        "CREATE TRIGGER my_event_batch AFTER INSERT ON rq_events"
        " FOR EACH STATEMENT EXECUTE FUNCTION my_log()",
        "DROP TRIGGER my_event_batch ON rq_events",
        id="statement-trigger",
    ),
    pytest.param(
        "rule 'my_event_rule'",
        "CREATE RULE my_event_rule AS ON INSERT TO rq_events"
        " DO ALSO INSERT INTO my_log VALUES (NEW.name)",
        "DROP RULE my_event_rule ON rq_events",
        id="rule",
    ),
    pytest.param(
        "policy 'my_events_policy'",
        "CREATE POLICY my_events_policy ON rq_events USING (job_id IS NOT NULL)",
        "DROP POLICY my_events_policy ON rq_events",
        id="policy",
    ),
    pytest.param(
        "view 'my_events'",
        "CREATE VIEW my_events AS SELECT job_id, name FROM rq_events WHERE kind = 'domain'",
        "DROP VIEW my_events",
        id="view",
    ),
    pytest.param(
        "materialized view 'my_event_counts'",
        "CREATE MATERIALIZED VIEW my_event_counts AS SELECT name, count(*) FROM rq_events"
        " GROUP BY name",
        "DROP MATERIALIZED VIEW my_event_counts",
        id="materialized-view",
    ),
    pytest.param(
        "column 'my_note' of",
        "ALTER TABLE rq_events ADD COLUMN my_note TEXT",
        "ALTER TABLE rq_events DROP COLUMN my_note",
        id="column",
    ),
    pytest.param(
        "constraint 'my_notes_event_id_fkey'",
        "CREATE TABLE my_notes (event_id BIGINT REFERENCES rq_events (id), note TEXT)",
        "ALTER TABLE my_notes DROP CONSTRAINT my_notes_event_id_fkey",
        id="foreign-key",
    ),
]


@pytest.mark.parametrize(("named", "create", "drop"), ON_EVENTS)
def test_an_object_of_the_owners_on_rq_events_refuses_0009_by_name_and_nothing_changes(
    pg: psycopg.Connection[Any], pg_schema_url: str, named: str, create: str, drop: str
) -> None:
    """The table rq_events becomes a view (events are written to rq_trace since): an
    index, trigger, rule or policy on the table cannot be made on the view, or would never
    fire there, and PostgreSQL would drop it without a word, as the values of a column the
    owner added (0009 copies the columns it knows); a view or foreign key over it
    made PostgreSQL refuse with a raw error. Each refuses the upgrade naming the migration
    and the object, saying how to drop it, and the schema is left as it was."""
    version = version_named("trace_packs")
    migrated_before(pg, version)
    pg.execute(create)
    before = schema_objects(pg)

    message = upgrade_refused(pg_schema_url)

    assert message.startswith(f"migration {version:04d} (trace_packs): the {named} ")
    assert " 'rq_events' is not replayq's and cannot be kept" in message
    assert f"drop it ({drop}), upgrade, then create what still applies" in message
    assert schema_objects(pg) == before
    assert applied(pg) == version - 1
    kind = pg.execute("SELECT relkind::text FROM pg_class WHERE oid = 'rq_events'::regclass")
    assert kind.fetchone() == ("r",)

    pg.execute(drop)  # as the message says: then the upgrade goes through
    storage = PostgresStorage(pg_schema_url)
    try:
        storage.migrate(now=0.0)
    finally:
        storage.close()
    assert applied(pg) == PG_MIGRATIONS[-1][0]


def test_privileges_granted_on_rq_events_are_granted_on_the_view_0009_puts_there(
    pg: psycopg.Connection[Any], pg_schema_url: str
) -> None:
    """A role of the owner's that reads the table rq_events (a dashboard) reads the view
    0009 puts in its place: its privileges went with the table, and are granted again."""
    reader = f"my_reader_{uuid.uuid4().hex[:8]}"
    migrated_before(pg, version_named("trace_packs"))
    pg.execute(f"CREATE ROLE {reader}")
    try:
        pg.execute(f"GRANT USAGE ON SCHEMA {schema_of(pg)} TO {reader}")
        pg.execute(f"GRANT SELECT ON rq_events TO {reader} WITH GRANT OPTION")
        pg.execute("GRANT SELECT ON rq_events TO PUBLIC")

        storage = PostgresStorage(pg_schema_url)
        try:
            storage.migrate(now=0.0)
        finally:
            storage.close()

        kind = "SELECT relkind::text FROM pg_class WHERE oid = 'rq_events'::regclass"
        assert pg.execute(kind).fetchone() == ("v",)
        acl = pg.execute(
            "SELECT CASE grantee WHEN 0 THEN 'PUBLIC' ELSE grantee::regrole::text END,"
            " privilege_type, is_grantable FROM aclexplode((SELECT relacl FROM pg_class"
            " WHERE oid = 'rq_events'::regclass))"
            " WHERE grantee <> (SELECT relowner FROM pg_class WHERE oid = 'rq_events'::regclass)"
            " ORDER BY 1"
        ).fetchall()
        assert acl == [("PUBLIC", "SELECT", False), (reader, "SELECT", True)]
        pg.execute(f"SET ROLE {reader}")
        assert pg.execute("SELECT COUNT(*) FROM rq_events").fetchone() == (0,)
    finally:
        pg.execute("RESET ROLE")
        pg.execute(f"DROP OWNED BY {reader}")
        pg.execute(f"DROP ROLE {reader}")


@pytest.mark.parametrize(
    ("migration", "create", "refused", "depending"),
    [
        pytest.param(
            "gc_reach",
            "CREATE TABLE my_refs (message_id TEXT REFERENCES rq_jobs (message_id))",
            "cannot drop constraint rq_jobs_message_id_key on table rq_jobs",
            "constraint my_refs_message_id_fkey on table my_refs",
            id="foreign-key-on-0011s-constraint",
        ),
        pytest.param(
            "trace_packs",
            "CREATE FUNCTION my_event_name(e rq_events) RETURNS text"
            " LANGUAGE sql AS 'SELECT e.name'",
            "cannot drop table rq_events",
            "function my_event_name(rq_events) depends on type rq_events",
            id="function-of-0009s-row-type",
        ),
    ],
)
def test_postgresqls_own_refusal_for_a_dependent_object_names_the_migration(
    pg: psycopg.Connection[Any],
    pg_schema_url: str,
    migration: str,
    create: str,
    refused: str,
    depending: str,
) -> None:
    """0011 drops the unique constraint on rq_jobs.message_id (dedup is per job type
    since), 0009 the table rq_events: a foreign key of the owner's on the one, a function
    of the owner's taking the other's row type, makes PostgreSQL refuse (SQLSTATE 2BP01).
    That comes out as a SchemaError naming the migration and the owner's object, not as
    the driver's error, and nothing changes."""
    version = version_named(migration)
    migrated_before(pg, version)
    pg.execute(create)
    before = schema_objects(pg)

    message = upgrade_refused(pg_schema_url)

    assert message.startswith(f"migration {version:04d} ({migration}): PostgreSQL refuses it: ")
    assert refused in message
    assert depending in message
    assert "Nothing was changed: drop them, upgrade" in message
    assert schema_objects(pg) == before
    assert applied(pg) == version - 1


def test_an_upgrade_from_the_first_migration_keeps_the_owners_objects_on_kept_tables(
    pg: psycopg.Connection[Any], pg_schema_url: str
) -> None:
    """Every migration at once, as an app's upgrade runs them, from a schema at 0008 with
    the owner's view, trigger and index on rq_jobs and a view over rq_entities (tables no
    migration drops): all are there after it, and the trigger fires as before."""
    migrated_before(pg, version_named("trace_packs"))
    pg.execute("CREATE VIEW my_jobs AS SELECT id, state FROM rq_jobs")
    pg.execute("CREATE VIEW my_heads AS SELECT key, version FROM rq_entities")
    pg.execute("CREATE INDEX my_jobs_by_payload ON rq_jobs (payload)")
    pg.execute(
        "CREATE TRIGGER my_job_deleted AFTER DELETE ON rq_jobs"
        " FOR EACH ROW EXECUTE FUNCTION my_log()"
    )
    pg.execute(
        "INSERT INTO rq_jobs (job_type, payload, state, run_at, created_at, max_attempts,"
        " trace_id) VALUES ('noop', '{}', 'queued', 0, 0, 3, 't1')"
    )
    owned = [row for row in schema_objects(pg) if row[1].startswith("my_")]

    storage = PostgresStorage(pg_schema_url)
    try:
        done = storage.migrate(now=0.0)
    finally:
        storage.close()

    assert {m.name for m in done} >= {"trace_packs", "gc_reach", "ledger_partitions"}
    assert [row for row in schema_objects(pg) if row[1].startswith("my_")] == owned
    assert pg.execute("SELECT state FROM my_jobs").fetchall() == [("queued",)]
    pg.execute("DELETE FROM rq_jobs")
    assert pg.execute("SELECT what FROM my_log").fetchall() == [("my_job_deleted",)]


# A migration that copies replayq's table rq_things (as SQLite's 0011 does) and makes its
# view rq_things_view again; replayq's objects and columns are those the script names.
COPY_THINGS = """
CREATE TABLE rq_things_new (id BIGINT PRIMARY KEY, name TEXT NOT NULL, size INTEGER);
INSERT INTO rq_things_new (id, name) SELECT id, name FROM rq_things;
DROP VIEW rq_things_view;
DROP TABLE rq_things;
ALTER TABLE rq_things_new RENAME TO rq_things;
CREATE INDEX rq_things_name ON rq_things (name);
CREATE VIEW rq_things_view AS SELECT id, name FROM rq_things;
"""
REPLAYQ_THINGS = migrate.replayq_names([COPY_THINGS])


def make_things(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE rq_things (id BIGINT PRIMARY KEY, name TEXT NOT NULL)")
    conn.execute("CREATE INDEX rq_things_name ON rq_things (name)")
    conn.execute("CREATE VIEW rq_things_view AS SELECT id, name FROM rq_things")
    conn.execute("INSERT INTO rq_things VALUES (1, 'one'), (2, 'two')")


def run_alone(url: str, script: str) -> None:
    storage = PostgresStorage(url)
    try:
        with storage.transaction() as tx:
            upgrade.run_migration(tx, script, REPLAYQ_THINGS)
    finally:
        storage.close()


def test_the_owners_index_trigger_and_rule_on_a_copied_table_are_made_again(
    pg: psycopg.Connection[Any], pg_schema_url: str
) -> None:
    """A migration that drops a table to copy it, and a view to make it again: the owner's
    index, row triggers and rule on the table, and INSTEAD OF trigger on the view, are made
    again in the same transaction, on the new ones, in the schema of the search path, a
    disabled trigger disabled and a comment kept."""
    make_things(pg)
    pg.execute("CREATE INDEX my_things_desc ON rq_things (id DESC)")
    pg.execute(
        "CREATE TRIGGER my_thing_added AFTER INSERT ON rq_things"
        " FOR EACH ROW EXECUTE FUNCTION my_log()"
    )
    pg.execute(
        "CREATE TRIGGER my_thing_quiet AFTER INSERT ON rq_things"
        " FOR EACH ROW EXECUTE FUNCTION my_log()"
    )
    pg.execute("ALTER TABLE rq_things DISABLE TRIGGER my_thing_quiet")
    pg.execute("COMMENT ON INDEX my_things_desc IS 'newest first'")
    pg.execute(
        "CREATE RULE my_thing_gone AS ON DELETE TO rq_things"
        " DO ALSO INSERT INTO my_log VALUES ('deleted ' || OLD.name)"
    )
    pg.execute(
        "CREATE FUNCTION my_insert_thing() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO rq_things (id, name) VALUES (NEW.id, NEW.name); RETURN NEW;"
        " END $$"
    )
    pg.execute(
        "CREATE TRIGGER my_thing_view_insert INSTEAD OF INSERT ON rq_things_view"
        " FOR EACH ROW EXECUTE FUNCTION my_insert_thing()"
    )
    owned = [row for row in schema_objects(pg) if row[1].startswith("my_")]
    old_oid = pg.execute("SELECT 'rq_things'::regclass::oid").fetchone()

    run_alone(pg_schema_url, COPY_THINGS)

    assert pg.execute("SELECT 'rq_things'::regclass::oid").fetchone() != old_oid
    assert [row for row in schema_objects(pg) if row[1].startswith("my_")] == owned
    indexdef = pg.execute("SELECT pg_get_indexdef('my_things_desc'::regclass)").fetchone()[0]
    assert indexdef.endswith("rq_things USING btree (id DESC)")
    assert pg.execute("SELECT obj_description('my_things_desc'::regclass)").fetchone() == (
        "newest first",
    )
    enabled = "SELECT tgname, tgenabled::text FROM pg_trigger WHERE tgrelid = 'rq_things'::regclass"
    assert sorted(pg.execute(enabled).fetchall()) == [
        ("my_thing_added", "O"),
        ("my_thing_quiet", "D"),  # disabled, as it was
    ]
    assert pg.execute("SELECT COUNT(*) FROM my_log").fetchone() == (0,)  # not for the copy
    pg.execute("INSERT INTO rq_things_view (id, name) VALUES (3, 'three')")
    pg.execute("DELETE FROM rq_things WHERE id = 1")
    log = pg.execute("SELECT what FROM my_log").fetchall()
    assert log == [("my_thing_added",), ("deleted one",)]


def test_a_drop_with_cascade_never_takes_the_owners_view_along(
    pg: psycopg.Connection[Any], pg_schema_url: str
) -> None:
    """``DROP TABLE ... CASCADE`` would drop the owner's view over the table without a
    word (no migration has one today): the view refuses the upgrade, before the script
    runs, and is there after; replayq's own view over the table does not."""
    make_things(pg)
    pg.execute("CREATE VIEW my_things AS SELECT name FROM rq_things")
    before = schema_objects(pg)
    script = COPY_THINGS.replace("DROP VIEW rq_things_view;\n", "").replace(
        "DROP TABLE rq_things;", "DROP TABLE rq_things CASCADE;"
    )

    with pytest.raises(SchemaError) as refused:
        run_alone(pg_schema_url, script)

    assert str(refused.value).startswith(
        "the view 'my_things' depending on 'rq_things' is not replayq's"
    )
    assert "drop it (DROP VIEW my_things)" in str(refused.value)
    assert schema_objects(pg) == before
    pg.execute("DROP VIEW my_things")
    run_alone(pg_schema_url, script)  # replayq's view goes along and is made again
    assert pg.execute("SELECT * FROM rq_things_view ORDER BY id").fetchall() == [
        (1, "one"),
        (2, "two"),
    ]


def test_a_column_the_owner_added_to_a_copied_table_refuses_the_copy(
    pg: psycopg.Connection[Any], pg_schema_url: str
) -> None:
    """The copy takes the columns the migration knows: the values of one the owner added
    would be lost. The upgrade is refused naming it; a column replayq's SQL names is not
    taken for the owner's."""
    make_things(pg)
    pg.execute("ALTER TABLE rq_things ADD COLUMN my_weight INTEGER")
    before = schema_objects(pg)

    with pytest.raises(SchemaError) as refused:
        run_alone(pg_schema_url, COPY_THINGS)

    assert str(refused.value).startswith(
        "the column 'my_weight' of 'rq_things' is not replayq's and cannot be kept: this"
        " upgrade drops 'rq_things' (to copy it, or to put a view in its place) and copies"
        " the columns it knows"
    )
    assert "drop it (ALTER TABLE rq_things DROP COLUMN my_weight)" in str(refused.value)
    assert schema_objects(pg) == before
    pg.execute("ALTER TABLE rq_things DROP COLUMN my_weight")
    pg.execute("ALTER TABLE rq_things ADD COLUMN size INTEGER")  # named by the script
    run_alone(pg_schema_url, COPY_THINGS)


def test_only_the_drops_the_runner_guards_are_in_postgresqls_migrations() -> None:
    """The runner reads which relations a script drops from its ``DROP TABLE`` and
    ``DROP VIEW`` statements. A migration that drops a column would drop the owner's
    indexes on it without a word too: none does, and one that does must be guarded."""
    drops = {
        version: migrate.dropped_relations(sql)
        for version, _, sql in PG_MIGRATIONS
        if migrate.dropped_relations(sql)
    }
    assert drops == {version_named("trace_packs"): frozenset({"rq_events"})}
    assert not [v for v, _, sql in PG_MIGRATIONS if "DROP COLUMN" in sql.upper()]
