"""An attempt's stop, its move back to the queue, or its burial refused by a constraint of
replayq's own tables (``rq_*``) parks the job as ``dead`` / ``internal_error``, as a
failure's refused settle does (``test_worker_internal_constraint_fail.py``).

``Outcomes._cancelled``, ``_put_back`` and ``_bury`` each settle the attempt in one write.
Before, when one of replayq's own constraints refused it (a bug of replayq's), the settle
raised out of the worker and the job stayed ``running``: reaped and run again, refused
again, until its attempts ran out. Stood in for by partial unique indexes the test adds to
``rq_jobs``, refusing the outcome's move of a second job of the type (and not a move to
``dead`` / ``internal_error``). The job is parked with its message naming the outcome that
was refused and the events dropped with it.
"""

from __future__ import annotations

from collections.abc import Callable

import replayq
import replayq.testing

AppFactory = Callable[..., replayq.App]


def _parked(app: replayq.App, job_id: int, settling: str, dropped: str) -> None:
    job = app.get_job(job_id)
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error"), (
        job.state,
        job.dead_reason,
        job.last_error,
    )
    error = job.last_error or ""
    assert "internal error of replayq" in error and "table rq_jobs" in error, error
    assert f"settling the attempt's {settling}" in error, error
    assert f"parked without: no pending trace events, {dropped}" in error, error
    assert job.attempt == 1, job.attempt
    (dead,) = [e for e in app.trace(job_id) if e.name == "job.dead"]
    assert dead.data["reason"] == "internal_error", dead.data


def test_a_stop_replayqs_own_table_refuses_is_parked(app_factory: AppFactory) -> None:
    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_cancelled ON rq_jobs (job_type) "
            "WHERE state = 'cancelled'"
        )

    @app.job("stops")
    def stops(ctx: replayq.Context, order: int) -> None:
        assert app.cancel(ctx.job_id)  # asked to stop while running, and stopping
        raise replayq.JobCancelledError("asked to stop")

    first = replayq.testing.run_inline(app, "stops", {"order": 1})
    assert first.state is replayq.JobState.CANCELLED, first.last_error
    # Its stop's move to cancelled is refused: a second cancelled job of the type.
    job = replayq.testing.run_inline(app, "stops", {"order": 2})
    _parked(app, job.id, "stop (asked to stop)", "job.cancelled")
    assert "job.cancelled" not in [e.name for e in app.trace(job.id)]


def test_a_burial_replayqs_own_table_refuses_is_parked(app_factory: AppFactory) -> None:
    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_malformed ON rq_jobs (job_type) "
            "WHERE dead_reason = 'malformed_payload'"
        )

    @app.job("typed")
    def typed(ctx: replayq.Context, n: int) -> None:
        pass

    producer = app_factory()  # declares no handlers: it cannot check the payload
    worker = replayq.Worker(app)
    first = producer.enqueue("typed", {"wrong": 1}, check=False)
    for leased in worker.lease(1):
        worker.execute(leased)
    assert app.get_job(first).dead_reason == "malformed_payload"
    # Its burial as malformed is refused: a second malformed job of the type.
    second = producer.enqueue("typed", {"wrong": 2}, check=False)
    for leased in worker.lease(1):
        worker.execute(leased)
    job = app.get_job(second)
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error")
    error = job.last_error or ""
    assert "internal error of replayq" in error and "table rq_jobs" in error, error
    assert "settling the attempt's burial (malformed_payload: " in error, error
    assert "parked without: no pending trace events" in error, error


def test_a_move_back_to_the_queue_replayqs_own_table_refuses_is_parked(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_put_back ON rq_jobs (job_type) "
            "WHERE state = 'queued' AND attempt >= 1"
        )

    @app.job("unlucky")
    def unlucky(ctx: replayq.Context, order: int) -> None:
        raise replayq.DatabaseUnavailableError("the queue's disk is gone")

    first = app.enqueue("unlucky", {"order": 1}, queue="first")
    worker = replayq.Worker(app, worker_id="first", queues=["first"])
    for job in worker.lease(1):
        worker.execute(job)
    assert app.get_job(first).state is replayq.JobState.QUEUED  # put back, not failed
    # Its move back to the queue is refused: a second job of the type put back.
    second = app.enqueue("unlucky", {"order": 2}, queue="second")
    worker = replayq.Worker(app, worker_id="second", queues=["second"])
    [leased] = worker.lease(1)
    assert leased.id == second
    worker.execute(leased)
    _parked(app, second, "move back to the queue (", "lease.released")
    assert "lease.released" not in [e.name for e in app.trace(second)]
