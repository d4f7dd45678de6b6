"""Guarantees that a review found broken, kept by tests: per-key order after a requeue,
rollback refusing writes interleaved between a job's own. (No step commit after the lease
was lost: ``test_owner_token_barrier.py``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from replayq.replay.rollback import RollbackRefusedError, plan_rollback, rollback
from replayq.testing import run_inline


def test_a_requeued_dead_job_does_not_run_beside_the_running_job_of_its_key(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()

    @app.job("touch", ordering="order:{order_id}", retry=replayq.Retry(max_attempts=1))
    def touch(ctx: replayq.Context, order_id: int, fail: bool = False) -> None:
        if fail:
            raise replayq.ValidationError("bad order")

    first = run_inline(app, "touch", {"order_id": 7, "fail": True})
    assert first.state is replayq.JobState.DEAD
    app.enqueue("touch", {"order_id": 7})
    worker = replayq.Worker(app, concurrency=2)
    running = worker.lease(1)
    assert [j.id for j in running] != [first.id]

    assert app.requeue(first.id, reason="fixed the order by hand")
    assert worker.lease(2) == [], "one job of a key runs at a time, even an older requeued one"


def test_rollback_refuses_when_another_job_wrote_between_the_jobs_own_writes(
    app_factory: Callable[..., replayq.App],
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    app.state.put("order", 1, {"status": "new"}, expected_version=0)

    @app.job("mark", retry=replayq.Retry(max_attempts=3, base="1s", cap="1s"))
    def mark(ctx: replayq.Context, status: str) -> None:
        with ctx.step("mark"):
            entity = ctx.state.get("order", 1)
            ctx.state.put("order", 1, {**entity.data, "status": f"{status}-{ctx.attempt}"})
        if status == "a" and ctx.attempt == 1:
            raise replayq.TransientError("upstream timed out after the step committed")

    a = app.enqueue("mark", {"status": "a"})
    worker = replayq.Worker(app)
    for job in worker.lease(1):
        worker.execute(job)  # attempt 1 writes v2, then fails: retry scheduled
    b = run_inline(app, "mark", {"status": "b"})  # job b writes v3
    clock.advance(2)
    for job in worker.lease(1):
        worker.execute(job)  # job a's attempt 2 writes v4
    assert app.get_job(a).state is replayq.JobState.SUCCEEDED
    assert [v.job_id for v in app.state.history("order", 1)] == [None, a, b.id, a]

    plan = plan_rollback(app, a)
    assert plan.changes[0].later_writers == [b.id]
    with pytest.raises(RollbackRefusedError, match=f"job {b.id} wrote order:1"):
        rollback(app, a)
    assert app.state.get("order", 1).data == {"status": "a-2"}
