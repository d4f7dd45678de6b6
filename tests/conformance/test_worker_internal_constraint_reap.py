"""The reaper's write refused by a constraint of replayq's own tables (``rq_*``) parks that
job and reaps the others: one bad row never stalls a worker's reaping and leasing.

``Reaping.reap`` buries, re-delivers or cancels every job whose lease expired, in one
transaction. Before, when one of replayq's own constraints refused its write for one job,
the refusal was raised out of ``reap()``: the whole pass rolled back, and the dispatcher
backed off on it every pass (its leasing behind the same ``try``), for good. Stood in for,
as in ``test_worker_internal_constraint.py``, by a partial unique index the test adds to
``rq_jobs``, refusing the reaper's bury of one job only (a second job of its type dead
with ``lease_expired_attempts_exhausted``). That job is parked ``dead`` /
``internal_error`` instead (the minimal write ``Outcomes._park`` makes), or, if even that
is refused, skipped with an error log; the other expired jobs are reaped in the same pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

import replayq

AppFactory = Callable[..., replayq.App]
ONCE = replayq.Retry(max_attempts=1)


def _app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    app = app_factory(clock=clock)

    @app.job("bad", lease="10s", retry=ONCE)
    def bad(ctx: replayq.Context, n: int) -> None:
        pass

    @app.job("good", lease="10s", retry=ONCE)
    def good(ctx: replayq.Context, n: int) -> None:
        pass

    return app


def _expire(app: replayq.App, clock: replayq.FrozenClock, job_type: str, n: int) -> int:
    """A job of ``job_type`` leased by a worker that then died, its lease past."""
    job_id = app.enqueue(job_type, {"n": n})
    [job] = replayq.Worker(app, worker_id=f"crashed-{n}").lease(1)
    assert job.id == job_id
    return job_id


def test_a_reap_replayqs_own_table_refuses_parks_that_job_and_reaps_the_others(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock()
    app = _app(app_factory, clock)
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_reaped ON rq_jobs (job_type) "
            "WHERE dead_reason = 'lease_expired_attempts_exhausted'"
        )
    first = _expire(app, clock, "bad", 1)
    clock.advance(11)
    reaper = replayq.Worker(app, worker_id="reaper")
    assert reaper.reap() == 1
    assert app.get_job(first).dead_reason == "lease_expired_attempts_exhausted"

    refused = _expire(app, clock, "bad", 2)
    other = _expire(app, clock, "good", 3)
    clock.advance(11)
    assert reaper.reap() == 2  # before: ConstraintViolationError, nothing reaped

    parked = app.get_job(refused)
    assert (parked.state, parked.dead_reason) == (replayq.JobState.DEAD, "internal_error")
    error = parked.last_error or ""
    assert "internal error of replayq" in error and "table rq_jobs" in error, error
    (dead,) = [e for e in app.trace(refused) if e.name == "job.dead"]
    assert dead.data["reason"] == "internal_error", dead.data
    reaped = app.get_job(other)
    assert (reaped.state, reaped.dead_reason) == (
        replayq.JobState.DEAD,
        "lease_expired_attempts_exhausted",
    )
    # Leasing goes on: a new job is leased and run by the same worker.
    fresh = app.enqueue("good", {"n": 4})
    assert [job.id for job in reaper.lease(1)] == [fresh]


def test_a_reap_whose_park_replayqs_own_table_refuses_too_is_skipped_and_logged(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Any move of the job to ``dead`` refused: it is skipped (an error in the log naming
    the refusal), stays ``running``; the other expired jobs are reaped, and the next pass
    does not stall on it either."""
    clock = replayq.FrozenClock()
    app = _app(app_factory, clock)
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_dead ON rq_jobs (job_type) WHERE state = 'dead'"
        )
    reaper = replayq.Worker(app, worker_id="reaper")
    _expire(app, clock, "bad", 1)
    clock.advance(11)
    assert reaper.reap() == 1

    stuck = _expire(app, clock, "bad", 2)
    other = _expire(app, clock, "good", 3)
    clock.advance(11)
    with caplog.at_level(logging.ERROR, logger="replayq.worker"):
        assert reaper.reap() == 1  # before: ConstraintViolationError, nothing reaped
    assert app.get_job(stuck).state is replayq.JobState.RUNNING
    assert app.get_job(other).state is replayq.JobState.DEAD
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"job {stuck} could not be reaped" in m and "rq_jobs" in m for m in logged), logged

    late = _expire(app, clock, "good", 4)
    clock.advance(11)
    # rq_jobs_one_dead refuses a second dead "good" job too: it is skipped as well.
    assert reaper.reap() == 0
    assert app.get_job(late).state is replayq.JobState.RUNNING
    fresh = app.enqueue("good", {"n": 5})
    assert [job.id for job in reaper.lease(1)] == [fresh]
