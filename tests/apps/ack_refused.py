"""A job whose ack is refused by a unique key, beside jobs whose acks are good.

``ship`` appends one line to ``$ACK_REFUSED_SIDE_FILE`` each time it runs (the ground
truth of execution) and inserts its order into the application's own ``shipments``
table outside any step (``ctx.db_write``): the insert commits with the job's ack. The
test has put a row for one order there first (another worker's shipment): that job's
ack is refused by the table's primary key every time it is tried, the others' are not.

``ship`` is declared at two versions, the same code, so that a test can route the type
(``rollout start v2 --canary 0%``): a routed type's successes are acked one by one,
not in groups.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import replayq

# Short enough that a job left running (its ack given up) is reaped and run again well
# within the test's wait; long enough for a busy machine.
LEASE = {"lease": "2s", "heartbeat": "0.5s"}
RETRY = replayq.Retry(max_attempts=3, base="0.05s", cap="0.2s")


def _marker(storage: Any) -> str:
    return "?" if storage.dialect == "sqlite" else "%s"


def _ship_row(order: int, marker: str) -> Any:
    def write(connection: Any) -> None:
        connection.execute(
            f"INSERT INTO shipments (order_id) VALUES ({marker})",  # noqa: S608 - placeholder only
            (order,),
        )

    return write


def _record(order: int, attempt: int, version: str) -> None:
    line = json.dumps(
        {
            "order": order,
            "attempt": attempt,
            "version": version,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(os.environ["ACK_REFUSED_SIDE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _ship(ctx: replayq.Context, order: int) -> dict[str, int]:
    _record(order, ctx.attempt, ctx.version)
    ctx.db_write(_ship_row(order, _marker(ctx.runtime.storage)))
    return {"order": order}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("ship", version="v1", retry=RETRY, **LEASE)(_ship)
    built.job("ship", version="v2", retry=RETRY, candidate=True, **LEASE)(_ship)
    return built


def create_table(app: replayq.App) -> None:
    """The application's ``shipments`` table, beside the queue's."""
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")


def ship_elsewhere(app: replayq.App, order: int) -> None:
    """Another worker's shipment of ``order``: the row ``ship``'s insert collides with."""
    with app.storage.transaction() as tx:
        _ship_row(order, _marker(app.storage))(tx.connection)


def shipped(app: replayq.App) -> list[int]:
    """The orders in ``shipments``, each as many times as it is there."""
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute("SELECT order_id FROM shipments ORDER BY order_id")
        return [int(row[0]) for row in rows.fetchall()]


app = build()
