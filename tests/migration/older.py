"""Databases as an older replayq left them: its migrations applied and recorded."""

from __future__ import annotations

import sqlite3
from typing import Any

from replayq.storage.queries import load_migrations
from replayq.storage.sqlite import register_migration_functions

MIGRATIONS = load_migrations("replayq.storage.sqlite.migrations")
PG_MIGRATIONS = load_migrations("replayq.storage.postgres.migrations")


def version_named(name: str) -> int:
    """The number of the migration called ``name`` (found by name: a renumbering changes
    nothing in the tests that use it)."""
    return next(version for version, found, _ in MIGRATIONS if found == name)


def names_from(version: int) -> list[str]:
    """The names of the migrations from ``version`` on, in order: what an upgrade of a
    database ``migrated_before(version)`` applies (the same numbering on both backends)."""
    return [name for number, name, _ in MIGRATIONS if number >= version]


def migrated_before(conn: Any, version: int) -> None:
    """Every migration below ``version`` applied on ``conn`` and recorded in
    ``rq_schema_migrations``, as replayq of that time would have left the database: a
    SQLite file, or (``conn`` a psycopg connection) the schema of its search path."""
    sqlite = isinstance(conn, sqlite3.Connection)
    if sqlite:  # 0026 calls rq_unhex, as replayq's runner provides it
        register_migration_functions(conn)
    conn.execute(
        "CREATE TABLE rq_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        f" applied_at {'REAL' if sqlite else 'DOUBLE PRECISION'} NOT NULL)"
    )
    record = "INSERT INTO rq_schema_migrations VALUES (?, ?, 0)"
    for number, name, sql in MIGRATIONS if sqlite else PG_MIGRATIONS:
        if number < version:
            (conn.executescript if sqlite else conn.execute)(sql)
            conn.execute(record if sqlite else record.replace("?", "%s"), (number, name))
