"""Databases as an older replayq left them: its migrations applied and recorded."""

from __future__ import annotations

import sqlite3
from typing import Any

from replayq.storage.queries import load_migrations

MIGRATIONS = load_migrations("replayq.storage.sqlite.migrations")


def version_named(name: str) -> int:
    """The number of the migration called ``name`` (found by name: a renumbering changes
    nothing in the tests that use it)."""
    return next(version for version, found, _ in MIGRATIONS if found == name)


def migrated_before(conn: sqlite3.Connection, version: int) -> None:
    """Every migration below ``version`` applied on ``conn`` and recorded in
    ``rq_schema_migrations``, as replayq of that time would have left the file."""
    conn.execute(
        "CREATE TABLE rq_schema_migrations (version INTEGER PRIMARY KEY,"
        " name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for number, name, sql in MIGRATIONS:
        if number < version:
            conn.executescript(sql)
            conn.execute("INSERT INTO rq_schema_migrations VALUES (?, ?, 0)", (number, name))


PG_MIGRATIONS = load_migrations("replayq.storage.postgres.migrations")


def pg_migrated_before(conn: Any, version: int) -> None:
    """The same on a psycopg connection whose search path is the schema to fill: every
    PostgreSQL migration below ``version`` applied and recorded."""
    conn.execute(
        "CREATE TABLE rq_schema_migrations (version INTEGER PRIMARY KEY,"
        " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
    )
    for number, name, sql in PG_MIGRATIONS:
        if number < version:
            conn.execute(sql)
            conn.execute("INSERT INTO rq_schema_migrations VALUES (%s, %s, 0)", (number, name))
