"""Migration 0025: rq_idempotency's status CHECK written as comparisons takes exactly what
it took, and the copied table is the table it was.

SQLite coded the CHECK's IN list as a temporary index built again for every row written;
0025 copies the table with the same condition as ORed comparisons. A record lost or
changed by the copy would let a side effect that already ran run again (or hide one in
doubt): every record must come out identical, column for column and rowid for rowid, read
as before, and the CHECK must still refuse any other status.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import replayq
from replayq.storage.sqlite import SqliteStorage
from replayq.testing import run_inline
from tests.migration.older import migrated_before, version_named

IDEMPOTENCY_CHECK = version_named("idempotency_check")
STATUSES = ("started", "succeeded", "failed", "compensated")
LARGE = '{"note":"' + "x" * 2000 + '"}'  # inline: the limit is 2048 bytes
RECORDS = [
    # key, operation, status, result, result_ref, error, claim_token, started_at,
    # completed_at, trace_id, job_id, attempt
    (
        "charge:1",
        "payment.charge",
        "succeeded",
        '{"charge_id":"ch_1"}',
        None,
        None,
        "c1",
        1.0,
        1.5,
        "t1",
        1,
        1,
    ),
    ("charge:2", "payment.charge", "started", None, None, None, "c2", 2.0, None, "t2", 2, 1),
    (
        "charge:3",
        "payment.charge",
        "failed",
        None,
        None,
        "card declined",
        "c3",
        3.0,
        3.5,
        None,
        None,
        None,
    ),
    (
        "mail:1",
        "mail.send",
        "compensated",
        None,
        "blob:sha256:" + "cd" * 32,
        None,
        "c4",
        4.0,
        4.5,
        "t4",
        4,
        2,
    ),
    ("big:1", "report.render", "succeeded", LARGE, None, None, "c5", 5.0, 5.5, "t5", 5, 1),
]
EVERY_RECORD = "SELECT rowid, * FROM rq_idempotency ORDER BY rowid"
INSERT_RECORD = "INSERT INTO rq_idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def database_before_the_migration(db: Path) -> list[tuple[object, ...]]:
    """Every migration before 0025, then the records above (one deleted: the rowids have a
    gap), as replayq wrote them then; every record with its rowid."""
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, IDEMPOTENCY_CHECK)
        conn.executemany(INSERT_RECORD, RECORDS)
        conn.execute("DELETE FROM rq_idempotency WHERE key = 'charge:3'")
        conn.execute(INSERT_RECORD, RECORDS[2])
        before = conn.execute(EVERY_RECORD).fetchall()
    conn.close()
    return before


def insert(conn: sqlite3.Connection, key: str, status: str | None) -> None:
    conn.execute(
        "INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at)"
        " VALUES (?, 'op', ?, 'c', 0)",
        (key, status),
    )


def test_the_copied_table_keeps_its_records_and_index_and_refuses_other_statuses(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    before = database_before_the_migration(db)
    assert [row[0] for row in before] == [1, 2, 4, 5, 6]
    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        assert storage.migrate(now=0.0)[0].name == "idempotency_check"
    finally:
        storage.close()

    conn = sqlite3.connect(db)
    try:
        assert conn.execute(EVERY_RECORD).fetchall() == before
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rq_idempotency'")
        text = sql.fetchone()[0]
        assert "status IN (" not in text and "status = 'compensated'" in text
        assert "WITHOUT ROWID" not in text
        indexes = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'rq_idempotency'"
            " ORDER BY name"
        ).fetchall()
        assert indexes == [("rq_idempotency_job",), ("sqlite_autoindex_rq_idempotency_1",)]
        with conn:
            for n, status in enumerate(STATUSES):
                insert(conn, f"new:{n}", status)
        for bad in ("done", "Started", "", "failed ", None):
            with pytest.raises(sqlite3.IntegrityError, match=r"CHECK|NOT NULL"), conn:
                insert(conn, "bad", bad)
            with pytest.raises(sqlite3.IntegrityError, match=r"CHECK|NOT NULL"), conn:
                update = "UPDATE rq_idempotency SET status = ? WHERE key = 'charge:2'"
                conn.execute(update, (bad,))
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_effects_recorded_before_the_migration_read_as_before_after_it(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    database_before_the_migration(db)
    app = replayq.App(f"sqlite:///{db}")
    calls: list[str] = []
    seen: dict[str, object] = {}

    @app.job("settle")
    def settle(ctx: replayq.Context) -> None:
        with ctx.step("charge"):
            seen["old"] = ctx.effect(
                "payment.charge", lambda: calls.append("old") or {}, key="charge:1"
            )
        with ctx.step("refund"):
            seen["new"] = ctx.effect("payment.refund", lambda: calls.append("new") or 7, key="r:1")

    try:
        assert run_inline(app, "settle", {}).state is replayq.JobState.SUCCEEDED
        # Succeeded before the upgrade: its stored result, no second call; a new key runs.
        assert calls == ["new"]
        assert seen == {"old": {"charge_id": "ch_1"}, "new": 7}
    finally:
        app.close()
