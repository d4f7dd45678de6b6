"""One schema on both backends: the migrations build the same tables, columns and indexes.

The SQLite migrations are checked statement by statement against ``schema.sql``
(``test_schema.py``); this test holds the PostgreSQL migrations to the same
schema: a table, column or index added to one backend's migration and not the
other's fails here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

import replayq
from replayq.storage.postgres import parse_postgres_url

Shape = dict[str, set[str]]


def sqlite_shape(path: Path) -> tuple[Shape, set[str]]:
    with sqlite3.connect(path) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master"
                " WHERE type IN ('table', 'view') AND name LIKE 'rq_%'"
            )
        ]
        columns = {
            table: {row[1] for row in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
            for table in tables
        }
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        }
    conn.close()
    return columns, indexes


def postgres_shape(url: str) -> tuple[Shape, set[str]]:
    conninfo, _ = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'rq\\_%'"
        ).fetchall()
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                "AND indexname NOT LIKE '%pkey' AND indexname NOT LIKE '%\\_key'"
            )
        }
    columns: Shape = {}
    for table, column in rows:
        columns.setdefault(table, set()).add(column)
    return columns, indexes


def test_both_backends_migrate_to_the_same_tables_columns_and_indexes(
    tmp_path: Path, pg_schema_url: str
) -> None:
    for url in (f"sqlite:///{tmp_path / 'shape.db'}", pg_schema_url):
        app = replayq.App(url, auto_migrate=True)
        app.storage  # noqa: B018 - opening it applies every migration
        app.close()

    sqlite_columns, sqlite_indexes = sqlite_shape(tmp_path / "shape.db")
    pg_columns, pg_indexes = postgres_shape(pg_schema_url)

    assert len(sqlite_columns) >= 15 and len(sqlite_indexes) >= 12  # the whole schema was read
    assert sorted(pg_columns) == sorted(sqlite_columns)
    for table, columns in sqlite_columns.items():
        assert pg_columns[table] == columns, table
    assert pg_indexes == sqlite_indexes
