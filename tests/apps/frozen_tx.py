"""A job that can hold its worker inside an open PostgreSQL transaction.

``pack`` runs one ``ctx.effect`` (``tests/apps/storage_faults.py``'s sink and counting
server), then, in the same step, a ``ctx.db_write`` keyed ``packed:{n}``: at the step's
commit it inserts one ``frozen_packed`` row and bumps the single ``frozen_totals`` row,
a row lock every job's commit needs. Job ``$FROZEN_TX_HOLD_JOB`` then waits inside
that transaction (its row locks held) while the file ``$FROZEN_TX_HOLD`` exists,
after writing its session's backend pid to ``<hold>.entered``: the point at which a
test freezes the worker (SIGSTOP) until ``idle_in_transaction_timeout`` ends it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import replayq
from tests.apps.storage_faults import _deliver

TABLES = (
    "CREATE TABLE frozen_packed (n int NOT NULL, worker text NOT NULL)",
    "CREATE TABLE frozen_totals (id int PRIMARY KEY, packed int NOT NULL)",
    "INSERT INTO frozen_totals VALUES (1, 0)",
)


def _hold_here(connection: Any, n: int) -> None:
    hold = os.environ.get("FROZEN_TX_HOLD")
    if not hold or str(n) != os.environ.get("FROZEN_TX_HOLD_JOB"):
        return
    row = connection.execute("SELECT pg_backend_pid() AS pid").fetchone()
    pid = row["pid"] if isinstance(row, dict) else row[0]
    Path(f"{hold}.entered").write_text(str(pid))
    while os.path.exists(hold):
        time.sleep(0.01)


def _write(connection: Any, n: int) -> None:
    worker = os.environ.get("FROZEN_TX_WORKER", "?")
    connection.execute("INSERT INTO frozen_packed (n, worker) VALUES (%s, %s)", (n, worker))
    connection.execute("UPDATE frozen_totals SET packed = packed + 1 WHERE id = 1")
    _hold_here(connection, n)


def pack(ctx: replayq.Context, n: int, sink: str) -> dict[str, int]:
    with ctx.step("pack"):
        ctx.effect("parcel.deliver", lambda: _deliver(sink, n))
        ctx.db_write(lambda connection: _write(connection, n), key=f"packed:{n}")
    return {"n": n}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job(
        "pack",
        idempotency="pack:{n}",
        lease="30s",
        heartbeat="2s",
        retry=replayq.Retry(max_attempts=3, base="0.05s", cap="0.2s"),
    )(pack)
    return built


app = build()
