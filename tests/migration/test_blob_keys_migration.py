"""Migration 0026: the blob store's keys as the SHA-256's 32 bytes, not its hex.

Events, state versions, steps and idempotency records keep referencing blobs as
``blob:sha256:<hex>``; only ``rq_blobs.hash`` changes (half the bytes, in the row and in
its index). A blob whose key the upgrade lost or changed would be a value gone for good
(``referenced but missing``), and one gc could no longer tell referenced would be
deleted: each blob stored before the upgrade must read back by the reference that named
it, the same content stored again must be the same row, and gc must keep what is
referenced and collect the rest, on both backends. On SQLite the table is copied (rows
and rowids as they were, as 0025 did); on PostgreSQL the column is altered in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import zstandard

import replayq
from replayq.errors import SchemaError
from replayq.recording.blobs import get_bytes, put_bytes
from replayq.storage.postgres import PostgresStorage, parse_postgres_url
from replayq.storage.sqlite import SqliteStorage
from tests.conftest import BACKENDS
from tests.migration.older import migrated_before, names_from, version_named

BLOB_KEYS = version_named("blob_keys")
DAY = 86_400.0
START = 1_700_000_000.0
OLD = START - 30 * DAY  # when the blobs were stored: long past gc's grace


def value(name: str) -> bytes:
    """A JSON value above the inline limit (so replayq kept it as a blob)."""
    return json.dumps({"name": name, "text": name * 4000}, separators=(",", ":")).encode()


def ref_of(data: bytes) -> str:
    return "blob:sha256:" + hashlib.sha256(data).hexdigest()


REFERENCED = {"state": value("s"), "step": value("t"), "effect": value("e")}
LOOSE = [value(f"loose{n}") for n in range(3)]  # referenced by nothing: gc's to collect
EVERY_BLOB = "SELECT rowid, * FROM rq_blobs ORDER BY rowid"


class Old:
    """A database at 0025 (every migration before 0026 applied and recorded) on one
    backend, with blobs stored as replayq then stored them: keyed by their hex."""

    def __init__(self, url: str, conn: Any) -> None:
        self.url = url
        self.conn = conn
        self.sqlite = isinstance(conn, sqlite3.Connection)

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(sql if self.sqlite else sql.replace("?", "%s"), params)

    def store(self, data: bytes, at: float) -> None:
        body = zstandard.ZstdCompressor(level=3).compress(data)
        self.run(
            "INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at, used_at)"
            " VALUES (?, 'zstd', ?, ?, ?, ?, ?)",
            (ref_of(data).removeprefix("blob:sha256:"), len(data), len(body), body, at, at),
        )

    def fill(self) -> None:
        migrated_before(self.conn, BLOB_KEYS)
        for n, data in enumerate([*REFERENCED.values(), *LOOSE]):
            self.store(data, OLD + n)
        # A gap in the rowids (SQLite keeps them across the copy).
        self.run("DELETE FROM rq_blobs WHERE hash = ?", (ref_of(LOOSE[0])[12:],))
        self.store(LOOSE[0], OLD + 9)
        # What references the first three: a state version, a step, an effect's record.
        self.run(
            "INSERT INTO rq_entity_versions (branch, namespace, key, version, data_ref, delta,"
            " created_at, hlc) VALUES ('main', 'doc', 'd1', 1, ?, '{}', ?, 1)",
            (ref_of(REFERENCED["state"]), OLD),
        )
        self.run(
            "INSERT INTO rq_entities (branch, namespace, key, version, hlc)"
            " VALUES ('main', 'doc', 'd1', 1, 1)"
        )
        self.run(
            "INSERT INTO rq_steps (job_id, step_key, step_name, attempt, trace_id, result_ref,"
            " completed_at) VALUES (1, 'render#0', 'render', 1, 't1', ?, ?)",
            (ref_of(REFERENCED["step"]), OLD),
        )
        self.run(
            "INSERT INTO rq_idempotency (key, operation, status, result_ref, claim_token,"
            " started_at, completed_at) VALUES ('mail:1', 'mail.send', 'succeeded', ?, 'c1',"
            " ?, ?)",
            (ref_of(REFERENCED["effect"]), OLD, OLD),
        )


@pytest.fixture(params=BACKENDS)
def old(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Old]:
    if request.param == "sqlite":
        path = tmp_path / "old.db"
        conn = sqlite3.connect(path)
        with conn:
            database = Old(f"sqlite:///{path}", conn)
            database.fill()
        conn.close()
        yield database
        return
    url = request.getfixturevalue("pg_schema_url")
    with psycopg.connect(parse_postgres_url(url)[0], autocommit=True) as conn:
        database = Old(url, conn)
        database.fill()
        yield database


def read(app: replayq.App, ref: str) -> bytes:
    with app.storage.transaction(readonly=True) as tx:
        return get_bytes(tx, ref)


def blob_rows(app: replayq.App) -> int:
    with app.storage.transaction(readonly=True) as tx:
        return int(tx.connection.execute("SELECT COUNT(*) FROM rq_blobs").fetchone()[0])


def test_blobs_stored_before_the_upgrade_read_back_by_their_references_and_gc_still_works(
    old: Old,
) -> None:
    clock = replayq.FrozenClock(START)
    app = replayq.App(
        old.url, clock=clock, retention=replayq.Retention(full_days=1), auto_migrate=True
    )
    try:
        statuses = app.storage.migration_status()
        assert all(m.applied_at is not None for m in statuses)
        assert [m.name for m in statuses if m.applied_at != 0] == names_from(BLOB_KEYS)
        # Every blob, by the reference that named it, through replayq's readers too.
        for data in [*REFERENCED.values(), *LOOSE]:
            assert read(app, ref_of(data)) == data
        assert app.state.get("doc", "d1").data == json.loads(REFERENCED["state"])

        # The same content stored now is the row stored then (the new key is the old one's
        # bytes); nothing else is stored.
        with app.storage.transaction() as tx:
            ref = put_bytes(tx, REFERENCED["step"], now=START, limit=1 << 20, what="test")
        assert ref == ref_of(REFERENCED["step"])
        assert blob_rows(app) == 6

        # gc's blob pass, two blobs a batch (its cursor is a key): the three nothing
        # references are collected, the referenced three kept and read back whole.
        report = app.gc(batch=2)
        assert report.blobs == 3 and report.blob_bytes > 0
        assert blob_rows(app) == 3
        for data in REFERENCED.values():
            assert read(app, ref_of(data)) == data
        with pytest.raises(replayq.StorageError, match="referenced but missing"):
            read(app, ref_of(LOOSE[1]))
        assert app.gc().blobs == 0, "a second pass finds nothing more"
    finally:
        app.close()


def test_a_key_written_as_hex_after_the_upgrade_is_refused_not_stored_unfindable(
    old: Old,
) -> None:
    """A process of the earlier release still running binds a blob's key as its hex text:
    after 0026 the insert is refused (the key's CHECK), where it would have stored a row
    no reader finds (and that gc, on PostgreSQL, would collect)."""
    app = replayq.App(old.url, auto_migrate=True)
    try:
        app.storage  # noqa: B018 - opening it applies 0026
    finally:
        app.close()
    data = value("late")
    body = zstandard.ZstdCompressor(level=3).compress(data)
    sql = (
        "INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at, used_at)"
        " VALUES (?, 'zstd', ?, ?, ?, 1, 1)"
    )
    params = (ref_of(data).removeprefix("blob:sha256:"), len(data), len(body), body)
    if old.sqlite:
        with (
            contextlib.closing(sqlite3.connect(old.url.removeprefix("sqlite:///"))) as conn,
            pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"),
        ):
            conn.execute(sql, params)
    else:
        with pytest.raises(psycopg.errors.CheckViolation, match="rq_blobs_hash_bytes"):
            old.run(sql, params)


def test_sqlite_copies_every_row_with_its_rowid_and_only_the_key_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    with conn:
        Old(f"sqlite:///{path}", conn).fill()
        before = conn.execute(EVERY_BLOB).fetchall()
    conn.close()
    assert [row[0] for row in before] == [1, 2, 3, 5, 6, 7]  # 4 deleted, then stored again
    storage = SqliteStorage(f"sqlite:///{path}")
    try:
        assert [m.name for m in storage.migrate(now=0.0)] == names_from(BLOB_KEYS)
    finally:
        storage.close()

    conn = sqlite3.connect(path)
    try:
        after = conn.execute(EVERY_BLOB).fetchall()
        assert after == [(row[0], bytes.fromhex(row[1]), *row[2:]) for row in before]
        kinds = conn.execute("SELECT DISTINCT typeof(hash), length(hash) FROM rq_blobs")
        assert kinds.fetchall() == [("blob", 32)]
        text = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rq_blobs'").fetchone()[0]
        assert "hash        BLOB    PRIMARY KEY" in text and "WITHOUT ROWID" not in text
        indexes = conn.execute("SELECT name FROM pragma_index_list('rq_blobs')").fetchall()
        assert indexes == [("sqlite_autoindex_rq_blobs_1",)]
        # The key is still unique, and found through its index.
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), conn:
            conn.execute(
                "INSERT INTO rq_blobs SELECT hash, codec, size, stored_size, body, created_at,"
                " used_at FROM rq_blobs LIMIT 1"
            )
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT codec, body FROM rq_blobs WHERE hash = ?", (b"k" * 32,)
        ).fetchall()
        assert "USING INDEX sqlite_autoindex_rq_blobs_1 (hash=?)" in plan[0][3]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


@pytest.mark.postgres
def test_postgres_alters_the_column_to_bytea_and_refuses_over_the_owners_view_of_it(
    pg_schema_url: str,
) -> None:
    """PostgreSQL cannot alter the type of a column a view reads: the owner's view over
    rq_blobs.hash refuses the upgrade, naming it, and nothing changes; without it, the
    column is bytea and the key still the primary key."""
    with psycopg.connect(parse_postgres_url(pg_schema_url)[0], autocommit=True) as conn:
        Old(pg_schema_url, conn).fill()
        conn.execute("CREATE VIEW my_blobs AS SELECT hash, size FROM rq_blobs")
        before = conn.execute("SELECT * FROM rq_blobs ORDER BY hash").fetchall()

        storage = PostgresStorage(pg_schema_url)
        try:
            assert_0026_refused(storage, conn, "my_blobs", before)

            conn.execute("DROP VIEW my_blobs")
            assert [m.name for m in storage.migrate(now=0.0)] == names_from(BLOB_KEYS)
        finally:
            storage.close()
        column = conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema ="
            " current_schema() AND table_name = 'rq_blobs' AND column_name = 'hash'"
        ).fetchone()
        assert column == ("bytea",)
        after = conn.execute("SELECT * FROM rq_blobs ORDER BY hash").fetchall()
        assert after == [(bytes.fromhex(row[0]), *row[1:]) for row in before]
        key = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid ="
            " 'rq_blobs'::regclass AND contype = 'p'"
        ).fetchone()
        assert key == ("PRIMARY KEY (hash)",)


def assert_0026_refused(
    storage: PostgresStorage, conn: psycopg.Connection[Any], names: str, before: list[Any]
) -> None:
    """The upgrade refused as a ``SchemaError`` naming ``names`` and PostgreSQL's reason,
    with nothing changed: the blobs as ``before``, the schema still before 0026."""
    with pytest.raises(SchemaError) as refused:
        storage.migrate(now=0.0)
    message = str(refused.value)
    assert message.startswith("migration 0026 (blob_keys): PostgreSQL refuses it")
    assert names in message and "Nothing was changed" in message
    assert conn.execute("SELECT * FROM rq_blobs ORDER BY hash").fetchall() == before
    version = conn.execute("SELECT MAX(version) FROM rq_schema_migrations").fetchone()
    assert version == (BLOB_KEYS - 1,)


@pytest.mark.parametrize(
    ("create", "drop", "names"),
    [
        (
            "CREATE TABLE my_refs (blob TEXT REFERENCES rq_blobs (hash))",
            "DROP TABLE my_refs",
            "my_refs",
        ),
        (
            "CREATE INDEX my_blob_prefix ON rq_blobs (hash text_pattern_ops)",
            "DROP INDEX my_blob_prefix",
            "text_pattern_ops",
        ),
        (
            "CREATE INDEX my_blob_upper ON rq_blobs (upper(hash))",
            "DROP INDEX my_blob_upper",
            "upper",
        ),
    ],
    ids=["foreign-key", "text-opclass-index", "text-function-index"],
)
def test_postgres_refuses_0026_over_the_owners_foreign_key_or_text_index_on_the_key(
    pg_schema_url: str, create: str, drop: str, names: str
) -> None:
    """A foreign key of the owner's to rq_blobs.hash, or an index of the owner's on it that
    only text has (an operator class, a function), cannot follow the column to bytea: the
    upgrade is a ``SchemaError`` with PostgreSQL's reason, nothing changes, and once the
    object is dropped the upgrade goes through."""
    with psycopg.connect(parse_postgres_url(pg_schema_url)[0], autocommit=True) as conn:
        Old(pg_schema_url, conn).fill()
        conn.execute(create)
        before = conn.execute("SELECT * FROM rq_blobs ORDER BY hash").fetchall()
        storage = PostgresStorage(pg_schema_url)
        try:
            assert_0026_refused(storage, conn, names, before)
            conn.execute(drop)
            assert [m.name for m in storage.migrate(now=0.0)] == names_from(BLOB_KEYS)
        finally:
            storage.close()
