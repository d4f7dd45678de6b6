"""Migration 0022: rq_jobs' state CHECK written as comparisons takes exactly what it took.

SQLite coded the CHECK's IN list as a temporary index built again for every row written;
0022 copies the table with the same condition as ORed comparisons. The copy keeps every
row, id, index and trigger, and the CHECK still refuses any other state.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import replayq
from tests.migration.older import MIGRATIONS, migrated_before, version_named

STATE_CHECK = version_named("state_check")
STATES = ("queued", "running", "succeeded", "dead", "cancelled")


def apply_state_check(conn: sqlite3.Connection) -> None:
    """Migration 0022 alone, as replayq applies it: later migrations change rq_jobs again
    (0023 adds two columns and drops the trigger), which is not what this file checks."""
    sql = next(sql for number, _, sql in MIGRATIONS if number == STATE_CHECK)
    conn.executescript(sql)


def insert_job(conn: sqlite3.Connection, state: str, n: int) -> int:
    cursor = conn.execute(
        "INSERT INTO rq_jobs (job_type, payload, state, run_at, created_at, max_attempts,"
        " trace_id) VALUES ('noop', ?, ?, 0, 0, 3, ?)",
        (f'{{"n":{n}}}', state, f"{n:032x}"),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def test_the_copied_table_keeps_its_rows_indexes_and_triggers_and_refuses_other_states(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, STATE_CHECK)
        ids = [insert_job(conn, state, n) for n, state in enumerate(STATES)]
        before = conn.execute("SELECT * FROM rq_jobs ORDER BY id").fetchall()
        packs_before = conn.execute("SELECT COUNT(*) FROM rq_trace").fetchone()[0]
        names = "SELECT type, name FROM sqlite_master WHERE tbl_name = 'rq_jobs' ORDER BY name"
        schema_before = conn.execute(names).fetchall()
    conn.close()
    conn = sqlite3.connect(db)
    try:
        apply_state_check(conn)
        with conn:
            new_id = insert_job(conn, "queued", 9)
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rq_jobs'").fetchone()[0]
        assert "state IN (" not in sql and "state = 'cancelled'" in sql
        after = conn.execute("SELECT * FROM rq_jobs WHERE id <= ? ORDER BY id", (ids[-1],))
        assert after.fetchall() == before
        assert conn.execute(names).fetchall() == schema_before  # every index and trigger
        # The copy wrote no pack; the insert after it wrote its one (the trigger is back).
        assert conn.execute("SELECT COUNT(*) FROM rq_trace").fetchone()[0] == packs_before + 1
        assert new_id == ids[-1] + 1
        with conn:
            for state in STATES:
                insert_job(conn, state, 10)
        for bad in ("done", "Queued", "", "queued "):
            with pytest.raises(sqlite3.IntegrityError, match="CHECK"), conn:
                insert_job(conn, bad, 11)
            with pytest.raises(sqlite3.IntegrityError, match="CHECK"), conn:
                conn.execute("UPDATE rq_jobs SET state = ? WHERE id = ?", (bad, ids[0]))
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_a_file_whose_owner_made_views_over_rq_jobs_upgrades_and_keeps_them(
    tmp_path: Path,
) -> None:
    """0022 copies rq_jobs, drops it and renames the copy: SQLite's rename checks every
    view and trigger of the schema, and a view of the file's owner over rq_jobs (gone
    for that moment: "no such table: main.rq_jobs") refused the whole upgrade. Such a
    view, and a trigger of the owner's on another table that reads rq_jobs, are kept and
    read the new table once it has the name again."""
    db = tmp_path / "owned.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, STATE_CHECK)
        ids = [insert_job(conn, state, n) for n, state in enumerate(STATES)]
        conn.execute(
            "CREATE VIEW my_done AS SELECT id, job_type FROM rq_jobs WHERE state = 'succeeded'"
        )
        conn.execute("CREATE TABLE my_audit (job_id INTEGER, state TEXT)")
        conn.execute(
            "CREATE TRIGGER my_audit_state AFTER INSERT ON my_audit BEGIN"
            " UPDATE my_audit SET state = (SELECT state FROM rq_jobs WHERE id = NEW.job_id)"
            " WHERE rowid = NEW.rowid; END"
        )
    conn.close()
    app = replayq.App(f"sqlite:///{db}", auto_migrate=True)  # every pending migration
    try:
        assert app.get_job(ids[0]) is not None
    finally:
        app.close()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT id FROM my_done").fetchall() == [(ids[2],)]
        with conn:
            conn.execute("INSERT INTO my_audit (job_id) VALUES (?)", (ids[3],))
        assert conn.execute("SELECT job_id, state FROM my_audit").fetchall() == [(ids[3], "dead")]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
