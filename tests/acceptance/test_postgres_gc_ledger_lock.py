"""gc's drop of an expired ledger day under another session's read of the ledger.

Dropping a day's partition takes an ``ACCESS EXCLUSIVE`` lock on the partitioned
``rq_trace_ledger``. A session whose transaction has read the ledger (a report left open,
a dashboard's session idle in its transaction) holds that lock off for as long as its
transaction lasts: ``replayq gc`` waits for it, and every read of the ledger that comes
after (``trace show``, ``events``, the dashboard) queues behind the waiting drop — not the
"milliseconds" docs/operations.md said. With a ``lock_timeout`` in its URL gc gives up
instead: exit 3 (``55P03``), the day kept, and the next pass drops it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

import pytest

import replayq
import replayq.testing
from tests.acceptance.workers import REPLAYQ, ROOT, run_cli, wait_for
from tests.apps import ledger_gc, retained
from tests.conftest import PG_URL

pytestmark = pytest.mark.postgres

DAY = 86_400.0
GC = ("gc", "--app", "tests.apps.ledger_gc:app", "--json")


def _partitions(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'rq_trace_ledger'::regclass"
        ).fetchall()
    return sorted(str(name) for (name,) in rows)


def _waiting(admin: Any, sql: str, *params: object) -> bool:
    return bool(admin.execute(sql, params or None).fetchone())


def test_a_ledger_day_drop_waits_for_an_open_read_and_a_lock_timeout_bounds_it(
    pg_schema_url: str,
) -> None:
    import psycopg

    # Jobs that finished ten days ago, moved to their ledger tier on their second day.
    clock = replayq.FrozenClock(time.time() - 10 * DAY)
    app = retained.declare(
        replayq.App(pg_schema_url, clock=clock, retention=ledger_gc.RETENTION, auto_migrate=True)
    )
    try:
        for amount in range(3):
            replayq.testing.run_inline(app, "credit", {"account": "a", "amount": amount})
        clock.advance(1.5 * DAY)
        assert app.gc().trimmed_jobs == 3
    finally:
        app.close()
    day = _partitions(pg_schema_url)
    assert len(day) == 1

    with (
        psycopg.connect(pg_schema_url) as reader,
        psycopg.connect(PG_URL, autocommit=True) as admin,
    ):
        reader.execute("SELECT count(*) FROM rq_trace_ledger")  # its transaction stays open

        bounded = run_cli(f"{pg_schema_url}%20-clock_timeout%3D500", *GC)
        assert bounded.returncode == 3, (bounded.stdout, bounded.stderr)
        lines = bounded.stderr.strip().splitlines()
        assert len(lines) == 1 and "55P03" in lines[0], bounded.stderr
        assert _partitions(pg_schema_url) == day, "the day kept for a later pass"

        python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        unbounded = subprocess.Popen(
            [REPLAYQ, "--db", pg_schema_url, *GC],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": python_path},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(
            lambda: _waiting(
                admin,
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%rq_trace_ledger_drop_days%'",
            ),
            timeout=30,
            what="gc's drop to wait for the open read",
        )
        read: list[Any] = []

        def probe() -> None:
            with psycopg.connect(pg_schema_url, application_name="rq-ledger-probe") as conn:
                read.append(conn.execute("SELECT count(*) FROM rq_trace_ledger").fetchone())

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        wait_for(
            lambda: _waiting(
                admin,
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'rq-ledger-probe'"
                " AND wait_event_type = 'Lock'",
            ),
            timeout=30,
            what="a read of the ledger to queue behind the waiting drop",
        )
        assert unbounded.poll() is None and not read
        reader.rollback()  # the report ends: the drop goes through, then the read

        out, err = unbounded.communicate(timeout=60)
        assert unbounded.returncode == 0, err
        assert json.loads(out)["partitions_dropped"] == 1, out
        prober.join(30)
        assert read, "the queued read went on after the drop"
    assert _partitions(pg_schema_url) == []
