"""Handlers whose ``ctx.db_write`` function raises an error of the application's own.

Each handler appends one JSON line to ``$DB_WRITE_RAISES_SIDE_FILE`` when it starts (the
ground truth of execution), puts ``order``'s state, and has ``ctx.db_write`` insert the
order into the application's own ``shipments`` table; the function then raises what the
payload's ``raises`` names (``zero``: ``ZeroDivisionError``; ``interrupt``:
``KeyboardInterrupt``; ``exit``: ``SystemExit``; none: it returns). Where the function
runs:

* ``pack`` — outside any step: it runs at the job's ack, in the worker's group commit;
* ``ship`` — the same, but declared at two versions so that a test can route the type
  (``rollout start v2 --canary 0%``): a routed type's successes are acked one by one;
* ``wrap`` and ``wrap_async`` (``async def``) — inside ``with ctx.step("wrap")``: it
  runs at that step's commit (an async handler's, on the worker's event loop).

The contract maps ``ZeroDivisionError`` to ``transient`` (two attempts, then ``dead``);
the other two are of no class it maps (``unknown``, never retried).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import replayq

LEASE = {"lease": "2s", "heartbeat": "0.5s"}
RETRY = replayq.Retry(max_attempts=2, base="0.05s", cap="0.2s")
ERRORS = {ZeroDivisionError: "transient"}
RAISES: dict[str, type[BaseException]] = {
    "zero": ZeroDivisionError,
    "interrupt": KeyboardInterrupt,
    "exit": SystemExit,
}


def _ran(job: str, order: int, attempt: int) -> None:
    line = json.dumps({"job": job, "order": order, "attempt": attempt, "pid": os.getpid()})
    path = os.environ["DB_WRITE_RAISES_SIDE_FILE"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def message(order: int) -> str:
    """What the function raises for ``order``: the job's error must say it."""
    return f"no shipment for order {order}"


def _insert_then_raise(
    ctx: replayq.Context, order: int, raises: str | None
) -> Callable[[Any], None]:
    marker = "?" if ctx.runtime.storage.dialect == "sqlite" else "%s"
    error = RAISES[raises] if raises else None

    def write(connection: Any) -> None:
        connection.execute(f"INSERT INTO shipments (order_id) VALUES ({marker})", (order,))  # noqa: S608 - placeholder marker only
        if error is not None:
            raise error(message(order))

    return write


def _ship(ctx: replayq.Context, order: int, raises: str | None = None) -> dict[str, int]:
    _ran(ctx.job.job_type, order, ctx.attempt)
    ctx.state.put("order", order, {"shipped": True})
    ctx.db_write(_insert_then_raise(ctx, order, raises))
    return {"order": order}


def wrap(ctx: replayq.Context, order: int, raises: str | None = None) -> dict[str, int]:
    _ran("wrap", order, ctx.attempt)
    with ctx.step("wrap"):
        ctx.state.put("order", order, {"shipped": True})
        ctx.db_write(_insert_then_raise(ctx, order, raises))
    return {"order": order}


async def wrap_async(ctx: replayq.Context, order: int, raises: str | None = None) -> dict[str, int]:
    _ran("wrap_async", order, ctx.attempt)
    with ctx.step("wrap"):
        ctx.state.put("order", order, {"shipped": True})
        ctx.db_write(_insert_then_raise(ctx, order, raises))
    return {"order": order}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    contract: dict[str, Any] = {"retry": RETRY, "errors": ERRORS, **LEASE}
    built.job("pack", **contract)(_ship)
    built.job("ship", version="v1", **contract)(_ship)
    built.job("ship", version="v2", candidate=True, **contract)(_ship)
    built.job("wrap", **contract)(wrap)
    built.job("wrap_async", **contract)(wrap_async)
    return built


def create_table(app: replayq.App) -> None:
    """The application's ``shipments`` table, beside the queue's."""
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")


def shipped(app: replayq.App) -> list[int]:
    """The orders in ``shipments``, each as many times as it is there."""
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute("SELECT order_id FROM shipments ORDER BY order_id")
        return [int(row[0]) for row in rows.fetchall()]


app = build()
