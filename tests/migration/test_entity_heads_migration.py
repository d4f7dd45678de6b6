"""Migration 0018: SQLite's entity heads, rebuilt WITHOUT ROWID, are the heads they were.

Every state read starts at an entity's head (``rq_entities``) and every write is a
compare-and-set on it: a head lost or changed by the table's rebuild would make an entity
read as missing (its versions orphaned) or let a write pass on a stale version. Heads
written before the migration must read, and guard writes, exactly as before it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import replayq
from replayq.testing import run_inline
from tests.migration.older import migrated_before, version_named

ENTITY_HEADS = version_named("entity_heads_without_rowid")


def database_before_the_migration(db: Path) -> None:
    """Every migration before 0018, then an order at version 2 and a customer at 1,
    written as replayq wrote them then (a head row and a row per version)."""
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, ENTITY_HEADS)
        versions = [
            ("order", "1", 1, None, '{"status":"new"}', 10),
            ("order", "1", 2, 1, '{"status":"paid"}', 20),
            ("customer", "7", 1, None, '{"name":"Ada"}', 30),
        ]
        for namespace, key, version, parent, data, hlc in versions:
            conn.execute(
                "INSERT INTO rq_entity_versions (branch, namespace, key, version,"
                " parent_version, data, delta, created_at, hlc)"
                " VALUES ('main', ?, ?, ?, ?, ?, '{}', 0, ?)",
                (namespace, key, version, parent, data, hlc),
            )
        conn.executemany(
            "INSERT INTO rq_entities (branch, namespace, key, version, hlc)"
            " VALUES ('main', ?, ?, ?, ?)",
            [("order", "1", 2, 20), ("customer", "7", 1, 30)],
        )
    conn.close()


def test_heads_written_before_the_migration_read_and_guard_writes_after_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    database_before_the_migration(db)
    app = replayq.App(f"sqlite:///{db}")
    seen: dict[str, Any] = {}

    @app.job("ship")
    def ship(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("ship"):
            order = ctx.state.get("order", order_id)
            seen["version"], seen["data"] = order.version, order.data
            ctx.state.put("order", order_id, {**order.data, "status": "shipped"})

    try:
        customer = app.state.get("customer", 7)
        assert (customer.version, customer.data) == (1, {"name": "Ada"})
        # A write on the version read before the head moved is refused...
        with pytest.raises(replayq.ConcurrencyError):
            app.state.put("order", 1, {"status": "lost"}, expected_version=1)
        # ...and a job reads the head and moves it on by one.
        assert run_inline(app, "ship", {"order_id": 1}).state is replayq.JobState.SUCCEEDED
        assert seen == {"version": 2, "data": {"status": "paid"}}
        order = app.state.get("order", 1)
        assert (order.version, order.data) == (3, {"status": "shipped"})
        assert app.state.get("order", 2).version == 0  # never written: still missing
    finally:
        app.close()
