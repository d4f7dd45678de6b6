"""A failure's own settle refused by a constraint of replayq's own tables (``rq_*``) parks
the job at once as ``dead`` / ``internal_error``: never left ``running`` to be reaped and
run again until its attempts run out (a loop, never parked).

``Outcomes._fail`` writes the attempt's pending trace rows and moves the job to ``dead``
or back to ``queued`` for its retry; before, when one of replayq's own constraints refused
that write, the settle raised and the job stayed ``running``. Stood in for, as in
``test_worker_internal_constraint.py``, by indexes the test adds to replayq's tables: one
``rq_trace`` pack of several events per attempt number (the failed attempt's pack, its
``state.read`` with ``job.failed`` and ``job.dead``, is refused: its trace rows), one job
of a type waiting for its retry (the retry's move is refused: the job row). The job is then
parked without what was refused, and its message says what was dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

import replayq
import replayq.testing

AppFactory = Callable[..., replayq.App]
LATER = replayq.Retry(max_attempts=3, base="1h", cap="1h")


def _parked(app: replayq.App, job: replayq.Job, table: str, dropped: str) -> None:
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error"), (
        job.state,
        job.dead_reason,
        job.last_error,
    )
    error = job.last_error or ""
    assert "internal error of replayq" in error, error
    assert f"table {table}" in error, error
    assert "ValueError: bad order" in error, error  # the attempt's own failure, kept
    assert dropped in error, error
    assert job.attempt == 1, job.attempt  # not run again
    (dead,) = [e for e in app.trace(job.id) if e.name == "job.dead"]
    assert dead.data["reason"] == "internal_error", dead.data


def test_a_failure_whose_trace_rows_replayqs_own_table_refuses_is_parked(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    runs: list[int] = []
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_trace_one_pack ON rq_trace (attempt) WHERE hlc_last > hlc"
        )

    @app.job("reads", retry=LATER)
    def reads(ctx: replayq.Context, order: int) -> None:
        runs.append(order)
        ctx.state.get("order", 1)
        if order > 1:
            raise ValueError("bad order")

    first = replayq.testing.run_inline(app, "reads", {"order": 1})
    assert first.state is replayq.JobState.SUCCEEDED, first.last_error
    # Its failure's trace rows (a pack of several events of attempt 1 again) are refused.
    job = replayq.testing.run_inline(app, "reads", {"order": 2})
    _parked(app, job, "rq_trace", "trace events")
    names = [e.name for e in app.trace(job.id)]
    assert "state.read" not in names and "job.failed" not in names, names
    assert runs == [1, 2], runs


def test_a_failure_whose_retry_replayqs_own_table_refuses_is_parked(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    runs: list[int] = []
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_retry ON rq_jobs (job_type) "
            "WHERE state = 'queued' AND last_error IS NOT NULL"
        )

    @app.job("flaky", retry=LATER, errors={ValueError: "transient"})
    def flaky(ctx: replayq.Context, order: int) -> None:
        runs.append(order)
        raise ValueError("bad order")

    first = replayq.testing.run_inline(app, "flaky", {"order": 1})
    assert first.state is replayq.JobState.QUEUED, first.last_error  # its retry in an hour
    # Its retry's move back to queued is refused: a second job waiting for its retry.
    job = replayq.testing.run_inline(app, "flaky", {"order": 2})
    _parked(app, job, "rq_jobs", "retry")
    names = [e.name for e in app.trace(job.id)]
    assert "retry.scheduled" not in names, names
    assert runs == [1, 2], runs


def test_a_failure_whose_move_to_dead_replayqs_own_table_refuses_is_logged_not_raised(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The one write a park cannot do without, the job row's move to ``dead``, refused
    too: the job stays ``running`` (reaped after its lease), said by an error in the log
    naming the refusal; the settle raises nothing into the worker. Before, the refusal
    was raised out of the worker's settle."""
    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_dead ON rq_jobs (job_type) WHERE state = 'dead'"
        )

    @app.job("fails")
    def fails(ctx: replayq.Context, order: int) -> None:
        raise ValueError("bad order")

    first = replayq.testing.run_inline(app, "fails", {"order": 1})
    assert (first.state, first.dead_reason) == (replayq.JobState.DEAD, "not_retryable")
    with caplog.at_level(logging.ERROR, logger="replayq.worker"):
        job = replayq.testing.run_inline(app, "fails", {"order": 2})
    assert job.state is replayq.JobState.RUNNING, job.state
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"job {job.id} could not be parked" in m for m in logged), logged
    assert any("refused too" in m and "rq_jobs" in m for m in logged), logged
