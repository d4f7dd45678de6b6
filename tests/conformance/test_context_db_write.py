"""`ctx.db_write`: the application's own rows commit in the step's transaction, once per key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq
from replayq.storage.protocol import idem_get
from replayq.testing import run_inline


def _shop_table(app: replayq.App) -> Callable[..., Any]:
    """Create the application's table and return a row counter (same database as the queue)."""
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE TABLE shop_invoices (order_id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"
        )

    def rows() -> list[tuple[int, int]]:
        with app.storage.transaction(readonly=True) as tx:
            cursor = tx.connection.execute(
                "SELECT order_id, amount FROM shop_invoices ORDER BY order_id"
            )
            return [tuple(row) for row in cursor.fetchall()]

    return rows


def _insert(app: replayq.App, order_id: int, amount: int) -> Callable[[Any], None]:
    marker = "?" if app.storage.dialect == "sqlite" else "%s"

    def write(connection: Any) -> None:
        connection.execute(
            f"INSERT INTO shop_invoices (order_id, amount) VALUES ({marker}, {marker})",  # noqa: S608 - placeholder marker only
            (order_id, amount),
        )

    return write


def test_db_write_commits_with_the_step_and_only_once_per_key(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    rows = _shop_table(app)

    @app.job("invoice")
    def invoice(ctx: replayq.Context, order_id: int, amount: int) -> None:
        with ctx.step("write_invoice"):
            ctx.db_write(_insert(app, order_id, amount), key=f"invoice:{order_id}")
            ctx.outbox.publish("invoice.created", {"order_id": order_id})

    first = run_inline(app, "invoice", {"order_id": 7, "amount": 120})
    again = run_inline(app, "invoice", {"order_id": 7, "amount": 999})

    assert first.state is replayq.JobState.SUCCEEDED
    assert rows() == [(7, 120)]
    writes = [e for e in app.trace(again.id) if e.name == "db.write"]
    assert writes[0].data["deduplicated"] is True
    assert again.state is replayq.JobState.SUCCEEDED
    with app.storage.transaction(readonly=True) as tx:
        record = idem_get(tx, "invoice:7")
        assert record is not None
        assert (record.status, record.job_id) == ("succeeded", first.id)
        # The step's other writes still commit: the key guards the application's rows only.
        assert len(tx.outbox_by_job(first.id)) == len(tx.outbox_by_job(again.id)) == 1


def test_db_write_rolls_back_when_its_step_fails(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    rows = _shop_table(app)

    @app.job("invoice", retry=replayq.Retry(max_attempts=1))
    def invoice(ctx: replayq.Context, order_id: int, amount: int) -> None:
        with ctx.step("write_invoice"):
            ctx.db_write(_insert(app, order_id, amount), key=f"invoice:{order_id}")
            ctx.outbox.publish("invoice.created", {"order_id": order_id})
            raise replayq.ValidationError("amount must be approved first")

    job = run_inline(app, "invoice", {"order_id": 8, "amount": 50})

    assert job.state is replayq.JobState.DEAD
    assert rows() == []
    with app.storage.transaction(readonly=True) as tx:
        assert idem_get(tx, "invoice:8") is None
        assert tx.outbox_by_job(job.id) == []


def test_db_write_outside_steps_commits_with_the_ack(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    rows = _shop_table(app)

    @app.job("invoice")
    def invoice(ctx: replayq.Context, order_id: int, amount: int) -> None:
        ctx.db_write(_insert(app, order_id, amount))

    job = run_inline(app, "invoice", {"order_id": 9, "amount": 10})

    assert job.state is replayq.JobState.SUCCEEDED
    assert rows() == [(9, 10)]
