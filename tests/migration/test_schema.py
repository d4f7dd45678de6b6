"""The schema built by all migrations equals the canonical schema file, and upgrades are recorded.

``src/replayq/storage/sqlite/schema.sql`` is the schema as the migrations leave
it, statement for statement. When a migration is added, regenerate it with::

    .venv/bin/python -m tests.migration.test_schema
"""

from __future__ import annotations

import json
import re
import sqlite3
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli import main
from replayq.storage import open_storage
from replayq.storage.queries import load_migrations
from replayq.storage.sqlite import SqliteStorage

MIGRATIONS = "replayq.storage.sqlite.migrations"
SCHEMA_FILE = resources.files("replayq.storage.sqlite") / "schema.sql"
HEADER = """\
-- The canonical SQLite schema: what applying every migration in migrations/ produces.
-- Not executed by replayq; tests/migration/test_schema.py checks it against the migrations.
-- Regenerate after adding a migration: .venv/bin/python -m tests.migration.test_schema
"""

Objects = list[tuple[str, str, str, str]]


def schema_objects(path: Path) -> Objects:
    """Every table, index, trigger and view, with the SQL that SQLite stored for it."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
    conn.close()
    return [tuple(row) for row in rows]


def migrated(path: Path) -> Path:
    SqliteStorage(f"sqlite:///{path}").migrate(now=0.0)
    return path


def canonical_text(path: Path) -> str:
    """The schema file for a database built by the migrations, in creation order."""
    with sqlite3.connect(path) as conn:
        statements = [
            sql
            for (sql,) in conn.execute(
                "SELECT sql FROM sqlite_master "
                "WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
    conn.close()
    return HEADER + "".join(f"\n{sql};\n" for sql in statements)


def test_schema_from_all_migrations_equals_the_canonical_schema_file(tmp_path: Path) -> None:
    from_migrations = schema_objects(migrated(tmp_path / "migrated.db"))
    canonical = tmp_path / "canonical.db"
    with sqlite3.connect(canonical) as conn:
        conn.executescript(SCHEMA_FILE.read_text(encoding="utf-8"))
    conn.close()

    assert schema_objects(canonical) == from_migrations, (
        "schema.sql and the migrations disagree; regenerate with "
        ".venv/bin/python -m tests.migration.test_schema"
    )


def test_migrations_are_numbered_in_sequence_from_one() -> None:
    versions = [version for version, _, _ in load_migrations(MIGRATIONS)]
    assert versions == list(range(1, len(versions) + 1))
    names = [entry.name for entry in resources.files(MIGRATIONS).iterdir()]
    assert all(re.fullmatch(r"\d{4}_\w+\.sql", n) for n in names if n.endswith(".sql"))


def backend_migrations(db_url: str) -> list[tuple[int, str, str]]:
    backend = "postgres" if db_url.startswith("postgresql") else "sqlite"
    return load_migrations(f"replayq.storage.{backend}.migrations")


def test_both_backends_have_the_same_migrations_by_number_and_name() -> None:
    sqlite = [(v, name) for v, name, _ in load_migrations(MIGRATIONS)]
    postgres = [(v, name) for v, name, _ in load_migrations("replayq.storage.postgres.migrations")]
    assert postgres == sqlite


def test_upgrading_twice_applies_nothing_the_second_time(db_url: str) -> None:
    storage = open_storage(db_url)
    try:
        assert all(status.applied_at is None for status in storage.migration_status())
        first = storage.migrate(now=1.0)
        assert [s.version for s in first] == [v for v, _, _ in backend_migrations(db_url)]
        assert storage.migrate(now=2.0) == []
        assert all(status.applied_at == 1.0 for status in storage.migration_status())
    finally:
        storage.close()


def test_app_refuses_a_schema_that_is_behind_when_not_migrating(db_url: str) -> None:
    app = replayq.App(db_url, auto_migrate=False)
    with pytest.raises(replayq.SchemaError, match="db upgrade"):
        app.enqueue("anything", {}, check=False)
    app.close()


def test_database_newer_than_this_code_is_refused(db_url: str) -> None:
    storage = open_storage(db_url)
    storage.migrate(now=0.0)
    with storage.transaction() as tx:
        tx.connection.execute(
            "INSERT INTO rq_schema_migrations VALUES (9999, 'from_the_future', 0)"
        )
    storage.close()
    app = replayq.App(db_url)
    with pytest.raises(replayq.SchemaError, match="9999"):
        app.list_jobs()
    app.close()


def test_cli_db_status_and_upgrade_report_each_migration(db_url: str) -> None:
    url = db_url
    runner = CliRunner()
    names = [f"{v:04d}_{name}" for v, name, _ in backend_migrations(db_url)]

    before = runner.invoke(main, ["--db", url, "db", "status"])
    assert before.exit_code == 0, before.output
    assert all(f"{name}" in before.output for name in names)
    assert before.output.count("PENDING") == len(names)

    upgraded = runner.invoke(main, ["--db", url, "db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.output.splitlines() == [f"applied {name}" for name in names]

    after = runner.invoke(main, ["--db", url, "db", "status", "--json"])
    statuses = json.loads(after.output)
    assert [s["version"] for s in statuses] == [int(name[:4]) for name in names]
    assert all(s["applied_at"] is not None for s in statuses)

    again = runner.invoke(main, ["db", "upgrade"], env={"REPLAYQ_DB": url})
    assert again.exit_code == 0
    assert again.output.strip() == "schema is up to date"


if __name__ == "__main__":  # regenerate the canonical schema file from the migrations
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        text = canonical_text(migrated(Path(scratch) / "schema.db"))
    target = Path(str(SCHEMA_FILE))
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
