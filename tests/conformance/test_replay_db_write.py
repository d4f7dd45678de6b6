"""A replay never runs a ``ctx.db_write`` function (docs/recording-context.md, "Your own
tables"; docs/replay.md: a dry-run's or fork's writes go to a throw-away branch).

The function writes a row of the application's own table in replayq's database, on
replayq's connection, at the step's commit. A dry-run (kept or not), and a fork from
before the step and from the step itself, run the handler again: the table still
holds the one row the recorded attempt wrote, and the function was not called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq
import replayq.testing
from replayq.replay.engine import dry_run, fork

AppFactory = Callable[..., replayq.App]


def _invoice_rows(app: replayq.App) -> list[tuple[Any, ...]]:
    with app.storage.transaction(readonly=True) as tx:
        cursor = tx.connection.execute("SELECT order_id, amount FROM invoices ORDER BY order_id")
        return [tuple(row) for row in cursor.fetchall()]


def test_a_replay_never_runs_a_db_write_function(app_factory: AppFactory) -> None:
    app = app_factory()
    placeholder = "?" if app.storage.dialect == "sqlite" else "%s"
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE TABLE invoices (order_id INTEGER PRIMARY KEY, amount INTEGER)"
        )
    calls: list[int] = []

    def insert(order: int) -> Callable[[Any], None]:
        def write(conn: Any) -> None:
            calls.append(order)
            conn.execute(
                f"INSERT INTO invoices (order_id, amount) VALUES ({placeholder}, {placeholder})",  # noqa: S608 - placeholder marker only
                (order, 100),
            )

        return write

    @app.job("invoice", retry=replayq.Retry(max_attempts=1))
    def invoice(ctx: replayq.Context, order: int) -> None:
        with ctx.step("load"):
            ctx.state.get("order", order)
        with ctx.step("write"):
            # Without a key: no idempotency record would stop a second run of it.
            ctx.db_write(insert(order))
            ctx.db_write(insert(order + 1), key=f"invoice:{order + 1}")

    job = replayq.testing.run_inline(app, "invoice", {"order": 7})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    assert calls == [7, 8] and _invoice_rows(app) == [(7, 100), (8, 100)]

    reports = [
        dry_run(app, job.id),
        dry_run(app, job.id, keep=False),
        fork(app, job.id, from_step="load"),
        fork(app, job.id, from_step="write"),
    ]

    assert calls == [7, 8], "a replay ran a db_write function"
    assert _invoice_rows(app) == [(7, 100), (8, 100)]
    for report in reports:
        assert report.outcome_now.status == "succeeded", report.to_dict()
