"""Jobs whose lock's release waits for an ack that never commits, for the lock-release tests.

``ship`` takes ``shelf:1``, writes ``order:N`` under it (``ctx.state.put``, outside any
step: it waits for the ack) and a row of the application's own ``shipments`` table
(``ctx.db_write``), then lets go of the lock: its release waits for the ack's commit,
after the writes it guarded. The insert names a column the table does not have (the
application's code ahead of its schema, its migration not run yet): the database
refuses it, not for a constraint (that would fail the attempt: ``ConstraintViolationError``)
nor for being away, so the ack's commit fails the same way every time and is given up,
and the job stays ``running`` until its lease runs out. ``take`` asks the same lock and
returns its fencing token.
"""

from __future__ import annotations

from typing import Any

import replayq

SHELF = "shelf:1"
TTL = "60s"  # the lock's TTL: far longer than the test's wait for ``take``


def _ship_row(order: int, marker: str) -> Any:
    def write(connection: Any) -> None:
        connection.execute(
            # ``carrier``: a column ``create_table`` does not make.
            f"INSERT INTO shipments (order_id, carrier) VALUES ({marker}, {marker})",  # noqa: S608
            (order, "standard"),
        )

    return write


def ship(ctx: replayq.Context, order: int) -> None:
    marker = "?" if ctx.runtime.storage.dialect == "sqlite" else "%s"
    with ctx.lock(SHELF, ttl=TTL):
        ctx.state.put("order", order, {"shipped": True})
        ctx.db_write(_ship_row(order, marker))


def take(ctx: replayq.Context, wait: float) -> int:
    with ctx.lock(SHELF, ttl=TTL, wait=wait) as lock:
        assert lock.fencing_token is not None
        return lock.fencing_token


def register(on: replayq.App) -> replayq.App:
    """``ship`` and ``take`` registered on ``on``."""
    on.job("ship", lease="30s", retry=replayq.Retry(max_attempts=1))(ship)
    on.job("take", lease="30s", retry=replayq.Retry(max_attempts=1))(take)
    return on


def build(url: str | None = None) -> replayq.App:
    return register(replayq.App(url))


def create_table(app: replayq.App) -> None:
    """The application's ``shipments`` table, beside the queue's, without the ``carrier``
    column ``ship`` writes."""
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")


app = build()
