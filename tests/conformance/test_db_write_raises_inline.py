"""A ``ctx.db_write`` function that raises fails its attempt when jobs run inline too
(``run_inline``, ``Worker.execute``: each success acked alone), wherever the function runs.

The function raises after its own insert; the commit it runs in (the job's ack, or its
step's) also carries a state write, an outbox row and another function's row, all made
under a lock that waits for that commit to be released. Nothing of it lands, the lock is
released all the same, and the job ends ``dead`` with the function's error, classified.

Before, at the ack any error but a ``JobError`` or a constraint's escaped
``Worker.execute`` and left the job ``running`` (reaped after its lease, run again);
``KeyboardInterrupt`` and ``SystemExit`` did so from a step's commit as well. Now the
attempt is settled first; those two are then raised on to the caller (a Ctrl-C still
stops a script that runs jobs inline), an ordinary error is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.storage.protocol import lock_get
from replayq.testing import run_inline
from tests.context_support import count_rows

RAISES: dict[str, type[BaseException]] = {
    "zero": ZeroDivisionError,
    "interrupt": KeyboardInterrupt,
    "exit": SystemExit,
}


def _app(app_factory: Callable[..., replayq.App], where: str, raises: str) -> replayq.App:
    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")
    marker = "?" if app.storage.dialect == "sqlite" else "%s"
    error = RAISES[raises]

    def insert(order: int, *, then_raise: bool) -> Callable[[Any], None]:
        def write(connection: Any) -> None:
            connection.execute(f"INSERT INTO shipments (order_id) VALUES ({marker})", (order,))  # noqa: S608 - placeholder marker only
            if then_raise:
                raise error(f"no shipment for order {order}")

        return write

    def writes(ctx: replayq.Context, order: int) -> None:
        with ctx.lock(f"order:{order}"):
            ctx.state.put("order", order, {"shipped": True})
            ctx.outbox.publish("order.shipped", {"order": order})
            ctx.db_write(insert(order + 100, then_raise=False), key=f"label:{order}")
            ctx.db_write(insert(order, then_raise=True))

    @app.job("ship", retry=replayq.Retry(max_attempts=1))
    def ship(ctx: replayq.Context, order: int) -> None:
        if where == "step":
            with ctx.step("ship"):
                writes(ctx, order)
        else:
            writes(ctx, order)

    return app


def _job(app: replayq.App) -> replayq.Job:
    [job_id] = [row[0] for row in _ids(app)]
    return app.get_job(job_id)


def _ids(app: replayq.App) -> list[tuple[int]]:
    with app.storage.transaction(readonly=True) as tx:
        return [tuple(row) for row in tx.connection.execute("SELECT id FROM rq_jobs").fetchall()]


@pytest.mark.parametrize("where", ["ack", "step"])
@pytest.mark.parametrize("raises", sorted(RAISES))
def test_a_db_write_function_raising_inline_fails_its_job_and_nothing_of_its_commit_lands(
    app_factory: Callable[..., replayq.App], where: str, raises: str
) -> None:
    app = _app(app_factory, where, raises)
    if raises == "zero":
        job = run_inline(app, "ship", {"order": 7})
    else:
        # Settled first, then raised on: a Ctrl-C stops the script that runs jobs inline.
        with pytest.raises(RAISES[raises], match="no shipment for order 7"):
            run_inline(app, "ship", {"order": 7})
        job = _job(app)

    name = RAISES[raises].__name__
    assert job.state is replayq.JobState.DEAD, (job.state, job.last_error)
    assert job.last_error == f"{name}: no shipment for order 7"
    assert (job.last_error_class, job.dead_reason, job.attempt) == ("unknown", "not_retryable", 1)
    names = [e.name for e in app.trace(job.id)]
    assert "job.failed" in names and "job.dead" in names, names
    if where == "step":
        assert "step.rolled_back" in names, names
    # Nothing of the commit the function spoiled: not its row, nor the other function's,
    # nor the state write, the outbox row or the other function's key.
    with app.storage.transaction(readonly=True) as tx:
        assert tx.connection.execute("SELECT order_id FROM shipments").fetchall() == []
        lock = lock_get(tx, "order:7")
    assert app.state.get("order", 7).version == 0
    assert count_rows(app.url, "rq_outbox") == 0
    assert count_rows(app.url, "rq_idempotency") == 0
    # The lock that waited for that commit was released with the failure.
    assert lock is not None and lock.owner_token is None, lock
