"""The owner's views, triggers, indexes and foreign keys across migrations that copy a table.

0011, 0017 and 0022 copy ``rq_jobs``, 0018 ``rq_entities``, 0025 ``rq_idempotency`` and
0026 ``rq_blobs`` (create the new table, copy the rows, drop the old, rename the new):
SQLite's rename checked every view of the schema while the table was gone, so an owner's
view over it refused the upgrade, and the drop took the owner's triggers and indexes on
it along without a word. Each
migration is applied alone here, as replayq applies it (``run_migration``), on a real
file at the version before it; then every migration at once, as an app's upgrade does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from replayq.errors import SchemaError
from replayq.storage.migrate import replayq_names
from replayq.storage.sqlite import SqliteStorage, run_migration
from tests.migration.older import MIGRATIONS, migrated_before, version_named

REPLAYQ_OWN = replayq_names([sql for _, _, sql in MIGRATIONS])


def apply_alone(db: Path, version: int) -> None:
    """Migration ``version`` by itself, in one transaction, as ``SqliteStorage.migrate``
    runs each (later ones change the same tables again, which is not what is checked)."""
    sql = next(sql for number, _, sql in MIGRATIONS if number == version)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        run_migration(conn, sql, REPLAYQ_OWN)
        conn.execute("COMMIT")
    finally:
        conn.close()


def insert_job(conn: sqlite3.Connection, n: int) -> None:
    conn.execute(
        "INSERT INTO rq_jobs (id, job_type, payload, state, run_at, created_at, max_attempts,"
        " trace_id) VALUES (?, 'noop', ?, 'queued', 0, 0, 3, ?)",
        (n, f'{{"n":{n}}}', f"{n:032x}"),
    )


def insert_head(conn: sqlite3.Connection, n: int) -> None:
    conn.execute(
        "INSERT INTO rq_entities (branch, namespace, key, version, hlc)"
        " VALUES ('production', 'order', ?, ?, ?)",
        (f"o{n}", n, n * 10),
    )


def insert_record(conn: sqlite3.Connection, n: int) -> None:
    conn.execute(
        "INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at, job_id)"
        " VALUES (?, 'charge', 'started', ?, 0, ?)",
        (f"o{n}", f"c{n}", n),
    )


def insert_blob(conn: sqlite3.Connection, n: int) -> None:
    """A blob as replayq stored it before 0026: keyed by its hash's hex."""
    conn.execute(
        "INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at, used_at)"
        " VALUES (?, 'raw', ?, 1, x'7b', 0, 0)",
        (f"{n:064x}", n),
    )


@dataclass(frozen=True)
class Owned:
    """A table a migration copies, and the owner's objects over it (literal SQL)."""

    table: str
    insert: Callable[[sqlite3.Connection, int], None]
    rows: str  # every row, in key order
    objects: tuple[str, ...]  # a view, a trigger that logs deletes, an index
    delete_first: str  # deletes the row of key 1


JOBS = Owned(
    "rq_jobs",
    insert_job,
    "SELECT * FROM rq_jobs ORDER BY id",
    (
        "CREATE VIEW my_view AS SELECT id FROM rq_jobs WHERE id IN (1, 3)",
        "CREATE TRIGGER my_deleted AFTER DELETE ON rq_jobs"
        " BEGIN INSERT INTO my_log VALUES ('deleted', OLD.id); END",
        "CREATE INDEX my_index ON rq_jobs (id DESC)",
    ),
    "DELETE FROM rq_jobs WHERE id = 1",
)
HEADS = Owned(
    "rq_entities",
    insert_head,
    "SELECT * FROM rq_entities ORDER BY key",
    (
        "CREATE VIEW my_view AS SELECT key FROM rq_entities WHERE key IN ('o1', 'o3')",
        "CREATE TRIGGER my_deleted AFTER DELETE ON rq_entities"
        " BEGIN INSERT INTO my_log VALUES ('deleted', OLD.key); END",
        "CREATE INDEX my_index ON rq_entities (key DESC)",
    ),
    "DELETE FROM rq_entities WHERE key = 'o1'",
)
RECORDS = Owned(
    "rq_idempotency",
    insert_record,
    "SELECT rowid, * FROM rq_idempotency ORDER BY key",
    (
        "CREATE VIEW my_view AS SELECT key FROM rq_idempotency WHERE key IN ('o1', 'o3')",
        "CREATE TRIGGER my_deleted AFTER DELETE ON rq_idempotency"
        " BEGIN INSERT INTO my_log VALUES ('deleted', OLD.key); END",
        "CREATE INDEX my_index ON rq_idempotency (key DESC)",
    ),
    "DELETE FROM rq_idempotency WHERE key = 'o1'",
)
BLOBS = Owned(
    "rq_blobs",
    insert_blob,
    # Not the key itself: 0026 stores it as its bytes (its own test checks it).
    "SELECT rowid, size, codec, stored_size, body, created_at, used_at FROM rq_blobs ORDER BY size",
    (
        "CREATE VIEW my_view AS SELECT size FROM rq_blobs WHERE size IN (1, 3)",
        "CREATE TRIGGER my_deleted AFTER DELETE ON rq_blobs"
        " BEGIN INSERT INTO my_log VALUES ('deleted', OLD.size); END",
        "CREATE INDEX my_index ON rq_blobs (size DESC)",
    ),
    "DELETE FROM rq_blobs WHERE size = 1",
)
# The migrations that copy a table: create the new, copy the rows, drop the old, rename.
COPIES = [
    ("gc_reach", JOBS),
    ("job_ids", JOBS),
    ("entity_heads_without_rowid", HEADS),
    ("state_check", JOBS),
    ("idempotency_check", RECORDS),
    ("blob_keys", BLOBS),
]


def make_owned(conn: sqlite3.Connection, owned: Owned) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS my_log (what TEXT, which)")
    for sql in owned.objects:
        conn.execute(sql)


def owners_schema(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name LIKE 'my_%' ORDER BY name"
    ).fetchall()


@pytest.mark.parametrize(("migration", "owned"), COPIES)
def test_the_owners_view_trigger_and_index_over_a_copied_table_are_kept(
    tmp_path: Path, migration: str, owned: Owned
) -> None:
    version = version_named(migration)
    db = tmp_path / "owned.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, version)
        for n in range(1, 5):
            owned.insert(conn, n)
        make_owned(conn, owned)
        rows = conn.execute(owned.rows).fetchall()
        schema = owners_schema(conn)
        viewed = conn.execute("SELECT * FROM my_view ORDER BY 1").fetchall()
    conn.close()

    apply_alone(db, version)  # refused before: "error in view my_view: no such table"

    conn = sqlite3.connect(db)
    try:
        assert conn.execute(owned.rows).fetchall() == rows
        assert conn.execute("SELECT * FROM my_view ORDER BY 1").fetchall() == viewed
        # The owner's trigger and index, with the SQL they were made with (dropped before).
        assert owners_schema(conn) == schema
        assert conn.execute("SELECT COUNT(*) FROM my_log").fetchone()[0] == 0  # not the copy
        with conn:
            conn.execute(owned.delete_first)
        assert conn.execute("SELECT * FROM my_log").fetchall() == [("deleted", viewed[0][0])]
        indexes = conn.execute("SELECT name FROM pragma_index_list(?)", (owned.table,))
        assert ("my_index",) in indexes.fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_a_trigger_of_the_owners_that_cannot_be_kept_refuses_the_upgrade_by_name(
    tmp_path: Path,
) -> None:
    """0009 puts a view in the place of the table rq_events (its events go to rq_trace
    since): a trigger on the table cannot be made on the view, nor would it ever fire
    again. The upgrade is refused, naming it, and the file is left as it was."""
    version = version_named("trace_packs")
    message = upgrade_refused(
        tmp_path / "old.db",
        version,
        "CREATE TABLE my_log (what TEXT)",
        "CREATE TRIGGER my_event_log AFTER INSERT ON rq_events"
        " BEGIN INSERT INTO my_log VALUES (NEW.name); END",
    )
    assert f"migration {version:04d} (trace_packs)" in message
    assert "trigger 'my_event_log' on 'rq_events'" in message
    assert "DROP TRIGGER my_event_log" in message


def upgrade_refused(db: Path, version: int, *owners: str) -> str:
    """The refusal of an upgrade of a file at ``version`` with the owner's statements
    applied; the file is left as it was (checked)."""
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, version)
        for sql in owners:
            conn.execute(sql)
        before = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    conn.close()

    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        with pytest.raises(SchemaError) as refused:
            storage.migrate(now=0.0)
    finally:
        storage.close()

    conn = sqlite3.connect(db)
    try:
        after = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")
        assert after.fetchall() == before
        applied = conn.execute("SELECT MAX(version) FROM rq_schema_migrations").fetchone()[0]
        assert applied == version - 1
        assert conn.execute("PRAGMA legacy_alter_table").fetchone()[0] == 0
    finally:
        conn.close()
    return str(refused.value)


def test_an_upgrade_across_every_copy_keeps_the_owners_objects_and_referencing_rows(
    tmp_path: Path,
) -> None:
    """A file from before 0011 upgraded by replayq in one go (0011, 0017, 0018, 0022 copy
    their tables): the owner's views, triggers and indexes are there after it, and a
    table of the owner's that references rq_jobs ON DELETE CASCADE keeps its rows (with
    foreign keys on, the drop of the old rq_jobs deleted its rows first, and theirs)."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, version_named("gc_reach"))
        for n in range(1, 5):
            insert_job(conn, n)
            insert_head(conn, n)
        make_owned(conn, JOBS)
        conn.execute("CREATE VIEW my_heads AS SELECT key, version FROM rq_entities")
        conn.execute(
            "CREATE TRIGGER my_heads_log AFTER UPDATE ON rq_entities"
            " BEGIN INSERT INTO my_log VALUES ('head', NEW.key); END"
        )
        conn.execute(
            "CREATE TABLE my_notes (job_id INTEGER NOT NULL"
            " REFERENCES rq_jobs (id) ON DELETE CASCADE, note TEXT)"
        )
        conn.executemany("INSERT INTO my_notes VALUES (?, 'note')", [(1,), (2,)])
        owned = owners_schema(conn)
    conn.close()

    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        done = storage.migrate(now=0.0)
        conn = storage._connection()
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # on again
        assert conn.execute("PRAGMA legacy_alter_table").fetchone()[0] == 0
    finally:
        storage.close()
    assert {m.name for m in done} >= {"gc_reach", "job_ids", "entity_heads_without_rowid"}

    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        assert owners_schema(conn) == owned
        assert conn.execute("SELECT * FROM my_view").fetchall() == [(1,), (3,)]
        assert len(conn.execute("SELECT * FROM my_heads").fetchall()) == 4
        assert conn.execute("SELECT job_id FROM my_notes").fetchall() == [(1,), (2,)]
        assert conn.execute("SELECT COUNT(*) FROM my_log").fetchone()[0] == 0
        with conn:
            conn.execute("UPDATE rq_entities SET version = 9 WHERE key = 'o1'")
            conn.execute("DELETE FROM rq_jobs WHERE id = 2")
        log = conn.execute("SELECT * FROM my_log ORDER BY rowid").fetchall()
        assert log == [("head", "o1"), ("deleted", 2)]
        assert conn.execute("SELECT job_id FROM my_notes").fetchall() == [(1,)]  # cascaded
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_an_instead_of_trigger_of_the_owners_on_a_view_replayq_makes_again_is_kept(
    tmp_path: Path,
) -> None:
    """0016 and 0023 drop replayq's view rq_events and make it again: an INSTEAD OF
    trigger of the owner's on it went with it, and is made again on the new view."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, version_named("trace_pack_deflate"))
        conn.execute("CREATE TABLE my_log (what TEXT)")
        conn.execute(
            "CREATE TRIGGER my_events_insert INSTEAD OF INSERT ON rq_events"
            " BEGIN INSERT INTO my_log VALUES (NEW.name); END"
        )
        owned = owners_schema(conn)
    conn.close()

    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        done = storage.migrate(now=0.0)
        assert {m.name for m in done} >= {"trace_pack_deflate", "enqueued_in_row"}
        conn = storage._connection()  # replayq's functions, which the view's SQL calls
        assert owners_schema(conn) == owned
        conn.execute("INSERT INTO rq_events (name) VALUES ('mine')")
        assert conn.execute("SELECT what FROM my_log").fetchall() == [("mine",)]
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("migration", "table"),
    [*((migration, owned.table) for migration, owned in COPIES), ("trace_packs", "rq_events")],
)
def test_a_column_the_owner_added_to_a_copied_table_refuses_the_upgrade_by_name(
    tmp_path: Path, migration: str, table: str
) -> None:
    """The copy takes the columns the migration knows (0009 those of an event): the
    values of a column the owner added would be lost. The upgrade is refused naming the
    migration and the column, and the file is left as it was."""
    version = version_named(migration)
    message = upgrade_refused(
        tmp_path / "old.db", version, f"ALTER TABLE {table} ADD COLUMN my_note TEXT"
    )
    assert message.startswith(
        f"migration {version:04d} ({migration}): the column 'my_note' of '{table}' is not"
        " replayq's and cannot be kept"
    )
    assert f"drop it (ALTER TABLE {table} DROP COLUMN my_note)" in message
