"""A handler's write refused by a constraint is the attempt's failure, class ``validation``
unless its contract maps it, on every backend: at a step's commit, and at the ack of a
job acked on its own (``run_inline``: no group commit). The constraint is named, the
refused row's values are not. And a group commit refused for one ack's write of another
kind acks the others. (Real workers and a group: ``tests/acceptance/test_ack_refused.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import replayq
import replayq.testing

AppFactory = Callable[..., replayq.App]
SECRET = 424242  # the refused row's key: never in the job's error
RETRY = replayq.Retry(max_attempts=3, base="0.001s", cap="0.001s")


def _insert(order: int, dialect: str) -> Callable[[Any], None]:
    marker = "?" if dialect == "sqlite" else "%s"

    def write(connection: Any) -> None:
        connection.execute(
            f"INSERT INTO shipments (order_id) VALUES ({marker})",  # noqa: S608 - placeholder only
            (order,),
        )

    return write


def _app(app_factory: AppFactory, **contract: Any) -> tuple[replayq.App, dict[str, int]]:
    app = app_factory()
    runs: dict[str, int] = {}
    dialect = app.storage.dialect
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")
        _insert(SECRET, dialect)(tx.connection)

    @app.job("in_step", retry=RETRY, **contract)
    def in_step(ctx: replayq.Context, order: int) -> None:
        runs["in_step"] = runs.get("in_step", 0) + 1
        with ctx.step("ship"):
            ctx.db_write(_insert(order, dialect))

    @app.job("at_ack", retry=RETRY, **contract)
    def at_ack(ctx: replayq.Context, order: int) -> None:
        runs["at_ack"] = runs.get("at_ack", 0) + 1
        ctx.state.put("order", order, {"shipped": True})
        ctx.db_write(_insert(order, dialect))

    return app, runs


def _named(app: replayq.App, error: str | None) -> None:
    assert error is not None and "ConstraintViolationError" in error, error
    if app.storage.dialect == "sqlite":
        assert "UNIQUE constraint failed: shipments.order_id" in error, error
    else:
        assert 'unique constraint "shipments_pkey"' in error, error
        assert "SQLSTATE 23505" in error, error
    assert str(SECRET) not in error, error  # the row's values stay out of the trace


def test_a_write_refused_by_a_unique_key_fails_the_attempt_as_validation(
    app_factory: AppFactory,
) -> None:
    app, runs = _app(app_factory)
    for job_type in ("in_step", "at_ack"):
        job = replayq.testing.run_inline(app, job_type, {"order": SECRET})
        assert (job.state, job.dead_reason, job.last_error_class) == (
            replayq.JobState.DEAD,
            "not_retryable",
            "validation",
        ), (job_type, job.state, job.last_error)
        _named(app, job.last_error)
        assert runs[job_type] == 1, runs
        failed = [e for e in app.trace(job.id) if e.name == "job.failed"]
        assert [e.data["error_class"] for e in failed] == ["validation"]
    # The ack's other write was discarded with the refused one.
    assert app.state.get("order", SECRET).version == 0


def test_a_contract_that_maps_constraint_violations_decides_their_retries(
    app_factory: AppFactory,
) -> None:
    app, runs = _app(app_factory, errors={replayq.ConstraintViolationError: "concurrency"})
    job = replayq.testing.run_inline(app, "at_ack", {"order": SECRET})
    # Retried as concurrency (a millisecond apart: its budget of three attempts), then dead.
    worker = replayq.Worker(app, worker_id="inline")
    deadline = time.monotonic() + 30
    while job.state is replayq.JobState.QUEUED and time.monotonic() < deadline:
        time.sleep(0.01)
        for leased in worker.lease(1):
            worker.execute(leased)
        job = app.get_job(job.id)
    worker.event_loop.close()
    assert (job.state, job.dead_reason, job.last_error_class) == (
        replayq.JobState.DEAD,
        "attempts_exhausted",
        "concurrency",
    ), job.last_error
    assert runs["at_ack"] == 3, runs


def _six_shipments_in_one_group(
    app_factory: AppFactory, write: Callable[[int, str], Callable[[Any], None]]
) -> tuple[replayq.App, dict[int, int], dict[int, int], replayq.WorkerStats]:
    """Six ``ship`` jobs whose handler writes ``write(order, marker)`` with
    ``ctx.db_write`` into a table ``shipments``, drained by one executor that leases all
    six at once and holds their acks: one group of six. The app, the job ids by order, the
    handler's runs by order and the worker's stats."""
    app = app_factory()
    marker = "?" if app.storage.dialect == "sqlite" else "%s"
    runs: dict[int, int] = {}
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY)")

    @app.job("ship", retry=RETRY, lease="30s")
    def ship(ctx: replayq.Context, order: int) -> None:
        runs[order] = runs.get(order, 0) + 1
        ctx.db_write(write(order, marker))

    ids = {order: app.enqueue("ship", {"order": order}) for order in range(1, 7)}
    worker = replayq.Worker(
        app, burst=True, prefetch=7, prefetch_window=float("inf"), ack_window=10.0
    )
    return app, ids, runs, worker.run()


def test_a_group_refused_for_one_ack_not_a_constraint_acks_the_others(
    app_factory: AppFactory,
) -> None:
    """A refusal that is neither a constraint nor an outage (an insert naming a column its
    table lacks) splits the group as well: the good acks commit; the bad one alone is
    tried again and given up, as before (the job stays running, reaped after its lease)."""

    def write(order: int, marker: str) -> Callable[[Any], None]:
        column = "carrier" if order == 3 else "order_id"  # ``carrier``: not in the table
        sql = f"INSERT INTO shipments ({column}) VALUES ({marker})"  # noqa: S608
        return lambda connection: connection.execute(sql, (order,))

    app, ids, runs, stats = _six_shipments_in_one_group(app_factory, write)

    assert stats.succeeded == 5, stats
    assert runs == dict.fromkeys(ids, 1), runs
    states = {order: app.get_job(job_id).state for order, job_id in ids.items()}
    assert states == {
        order: replayq.JobState.RUNNING if order == 3 else replayq.JobState.SUCCEEDED
        for order in ids
    }, states


def test_a_write_function_that_raises_at_the_ack_fails_its_own_job_and_no_other(
    app_factory: AppFactory,
) -> None:
    """A handler's ``ctx.db_write`` function runs in the ack's commit; one that raises a
    plain Python error there (not the database's) used to give up its whole group: the
    other jobs, which had succeeded, were reaped and run again, and the faulty one ran
    again and raised again. Now the group is split, the good acks commit once, and the
    faulty ack is its attempt's failure, classified by its contract (an error of class
    ``unknown``, which this contract does not retry: dead at once, never reaped and run
    again)."""

    def write(order: int, marker: str) -> Callable[[Any], None]:
        def insert(connection: Any) -> None:
            if order == 3:
                raise KeyError("carrier")  # the application's own bug, at the commit
            connection.execute(f"INSERT INTO shipments (order_id) VALUES ({marker})", (order,))  # noqa: S608

        return insert

    app, ids, runs, stats = _six_shipments_in_one_group(app_factory, write)

    assert stats.succeeded == 5, stats
    assert runs == dict.fromkeys(ids, 1), runs
    states = {order: app.get_job(job_id).state for order, job_id in ids.items()}
    assert states == {
        order: replayq.JobState.DEAD if order == 3 else replayq.JobState.SUCCEEDED for order in ids
    }, states
    (failed, *_) = [e for e in app.trace(ids[3]) if e.name == "job.failed"]
    assert "KeyError" in str(failed.data.get("error")) or "carrier" in str(
        failed.data.get("error")
    ), failed.data
    with app.storage.transaction(readonly=True) as tx:
        stored = sorted(
            r[0] for r in tx.connection.execute("SELECT order_id FROM shipments").fetchall()
        )
    assert stored == [1, 2, 4, 5, 6]
