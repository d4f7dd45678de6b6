"""Handlers whose ``ctx.db_write`` function calls ``ctx`` inside the step's commit.

``reenter`` (a plain handler) and ``reenter_async`` (``async def``) insert their order into
the application's own ``deliveries`` table at the commit of step ``outer``
(``ctx.db_write``), and from inside that function call the ``ctx`` verb the payload names
(``call``, ``effect``, ``step``). Each appends one JSON line to ``$CALLBACK_REENTRY_SIDE_FILE``
when it starts (the ground truth of execution). ``deliver`` and ``deliver_async`` do the
same insert without the call: the jobs a worker must still run afterwards.
``reenter_at_ack`` calls from a function that waits for the ack (outside steps).

Before the fix the call waited for the context's ``_live``, held by the very commit it
ran in: the worker's slot hung for good (its heartbeat kept the lease; on SQLite the
commit kept the database's write lock; an async one froze the worker's event loop).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import replayq

LEASE = {"lease": "2s", "heartbeat": "0.5s"}
RETRY = replayq.Retry(max_attempts=3, base="0.05s", cap="0.2s")


def _ran(job: str, order: int, attempt: int) -> None:
    line = json.dumps({"job": job, "order": order, "attempt": attempt, "pid": os.getpid()})
    path = os.environ["CALLBACK_REENTRY_SIDE_FILE"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _verb(ctx: replayq.Context, verb: str) -> Callable[[], Any]:
    return {
        "call": lambda: ctx.call("price", lambda: 42),
        "effect": lambda: ctx.effect("mail.send", lambda: "sent", key=f"mail:{ctx.job_id}"),
        "step": lambda: ctx.step("inner", lambda: 1),
    }[verb]


def _insert(ctx: replayq.Context, order: int) -> Callable[[Any], None]:
    marker = "?" if ctx.runtime.storage.dialect == "sqlite" else "%s"

    def insert(connection: Any) -> None:
        connection.execute(f"INSERT INTO deliveries (order_id) VALUES ({marker})", (order,))  # noqa: S608 - placeholder marker only

    return insert


def _write_then(ctx: replayq.Context, order: int, verb: str | None) -> Callable[[Any], None]:
    insert, use = _insert(ctx, order), _verb(ctx, verb) if verb else None

    def write(connection: Any) -> None:
        insert(connection)
        if use is not None:
            use()

    return write


def reenter(ctx: replayq.Context, order: int, verb: str) -> dict[str, int]:
    _ran("reenter", order, ctx.attempt)
    with ctx.step("outer"):
        ctx.db_write(_write_then(ctx, order, verb))
    return {"order": order}


async def reenter_async(ctx: replayq.Context, order: int, verb: str) -> dict[str, int]:
    _ran("reenter_async", order, ctx.attempt)
    with ctx.step("outer"):
        ctx.db_write(_write_then(ctx, order, verb))
    return {"order": order}


def reenter_at_ack(ctx: replayq.Context, order: int, verb: str) -> dict[str, int]:
    """The same outside any step: the function runs in the worker's group commit of acks."""
    _ran("reenter_at_ack", order, ctx.attempt)
    ctx.db_write(_write_then(ctx, order, verb))
    return {"order": order}


def deliver(ctx: replayq.Context, order: int) -> dict[str, int]:
    _ran("deliver", order, ctx.attempt)
    with ctx.step("outer"):
        ctx.db_write(_write_then(ctx, order, None))
    return {"order": order}


async def deliver_async(ctx: replayq.Context, order: int) -> dict[str, int]:
    _ran("deliver_async", order, ctx.attempt)
    with ctx.step("outer"):
        ctx.db_write(_write_then(ctx, order, None))
    return {"order": order}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    for fn in (reenter, reenter_async, reenter_at_ack, deliver, deliver_async):
        built.job(fn.__name__, retry=RETRY, **LEASE)(fn)
    return built


def create_table(app: replayq.App) -> None:
    """The application's ``deliveries`` table, beside the queue's."""
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE deliveries (order_id INTEGER PRIMARY KEY)")


def delivered(app: replayq.App) -> list[int]:
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute("SELECT order_id FROM deliveries ORDER BY order_id")
        return [int(row[0]) for row in rows.fetchall()]


app = build()
