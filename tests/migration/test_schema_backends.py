"""One schema on both backends: each backend's migrations build the tables, columns and
indexes of the canonical ``schema.sql``.

The SQLite migrations are also checked statement by statement against it
(``test_schema.py``); this test runs on every backend (``db_url``), so a table,
column or index added to one backend's migration and not the other's fails here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

import replayq
from replayq.storage import packs
from replayq.storage.postgres import parse_postgres_url
from tests.migration.test_schema import SCHEMA_FILE

Shape = dict[str, set[str]]

# PostgreSQL's alone (migration 0013): the ledger tier in day partitions, which SQLite has
# no use for (its 0013 says why). Every other table, column and index is on both.
POSTGRES_ONLY_TABLES = {"rq_trace_ledger", "rq_trace_ledger_resources"}
POSTGRES_ONLY_INDEXES = {"rq_trace_ledger_job", "rq_trace_ledger_hlc"}
# SQLite's alone (migration 0023): a new job's job.enqueued pack kept in its row, and the
# views that read it beside rq_trace's packs. PostgreSQL writes that pack to rq_trace in the
# statement that inserts the job (its 0023 says so).
# And (migration 0029) the dictionaries learned per job type that SQLite's deflated packs
# name: PostgreSQL's packs are JSON text (its 0029 says so).
SQLITE_ONLY_TABLES = {"rq_packs", "rq_pack_events", "rq_enqueued_events", "rq_pack_dictionaries"}
SQLITE_ONLY_COLUMNS = {"rq_jobs": {"enqueued_hlc", "enqueued"}}
SQLITE_ONLY_INDEXES = {"rq_jobs_enqueued_hlc"}


def sqlite_shape(path: Path) -> tuple[Shape, set[str]]:
    with sqlite3.connect(path) as conn:
        packs.register_sqlite(conn)  # pragma_table_info of rq_events compiles the view
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
    assert set(columns) >= POSTGRES_ONLY_TABLES and indexes >= POSTGRES_ONLY_INDEXES
    for table in POSTGRES_ONLY_TABLES:
        del columns[table]
    return columns, indexes - POSTGRES_ONLY_INDEXES


def migrated_shape(db_url: str) -> tuple[Shape, set[str]]:
    app = replayq.App(db_url, auto_migrate=True)
    app.storage  # noqa: B018 - opening it applies every migration
    app.close()
    if db_url.startswith("sqlite:///"):
        return sqlite_shape(Path(db_url.removeprefix("sqlite:///")))
    return postgres_shape(db_url)


def test_each_backends_migrations_build_the_tables_columns_and_indexes_of_the_schema_file(
    db_url: str, tmp_path: Path
) -> None:
    canonical = tmp_path / "canonical.db"
    with sqlite3.connect(canonical) as conn:
        conn.executescript(SCHEMA_FILE.read_text(encoding="utf-8"))
    conn.close()
    schema_columns, schema_indexes = sqlite_shape(canonical)
    columns, indexes = migrated_shape(db_url)
    if not db_url.startswith("sqlite:///"):
        for table in SQLITE_ONLY_TABLES:
            del schema_columns[table]
        for table, names in SQLITE_ONLY_COLUMNS.items():
            schema_columns[table] -= names
        schema_indexes -= SQLITE_ONLY_INDEXES

    assert len(schema_columns) >= 15 and len(schema_indexes) >= 12  # the whole file was read
    assert sorted(columns) == sorted(schema_columns)
    for table, names in schema_columns.items():
        assert columns[table] == names, table
    assert indexes == schema_indexes
