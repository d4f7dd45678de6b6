"""A ``ctx`` lives as long as its attempt, on every backend: kept past it (a thread, a
closure called later), every view and verb refuses with ``ContextEndedError`` naming the
attempt, and nothing of the late use is recorded or written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.replay.bulk import dry_run_many
from replayq.replay.engine import dry_run
from replayq.replay.rerun import rerun
from tests.context_support import count_rows, run_once

AppFactory = Callable[..., replayq.App]

# Each view read and each verb a kept ``ctx`` might be used for after its attempt.
LATE_USES: dict[str, Callable[[replayq.Context], Any]] = {
    "ctx.state": lambda ctx: ctx.state.put("order", "late", {"paid": True}),
    "ctx.effects": lambda ctx: ctx.effects,
    "ctx.locks": lambda ctx: ctx.locks,
    "ctx.cache": lambda ctx: ctx.cache,
    "ctx.outbox": lambda ctx: ctx.outbox.publish("orders.late", {"id": 1}),
    "ctx.step": lambda ctx: ctx.step("late", lambda: 1),
    "with ctx.step": lambda ctx: ctx.step("late").__enter__(),
    "ctx.call": lambda ctx: ctx.call("late.read", lambda: 1),
    "ctx.effect": lambda ctx: ctx.effect("late.send", lambda: 1, key="late"),
    "ctx.decide": lambda ctx: ctx.decide("late", True),
    "ctx.lock": lambda ctx: ctx.lock("late"),
    "ctx.enqueue": lambda ctx: ctx.enqueue("keeps", {"n": 2}),
    "ctx.db_write": lambda ctx: ctx.db_write(lambda connection: None),
}


def keeping_app(app: replayq.App, kept: list[replayq.Context]) -> None:
    """Declare ``keeps``: a handler that builds two of its views and keeps its ``ctx``."""

    @app.job("keeps")
    def keeps(ctx: replayq.Context, n: int) -> None:
        with ctx.step("write"):
            ctx.state.put("order", str(n), {"n": n})  # the state view, built in the attempt
            ctx.cache.get("price", str(n))  # and the cache view
        kept.append(ctx)


def assert_refused_after_the_attempt(ctx: replayq.Context, job_id: int, attempt: int = 1) -> None:
    for use, late in LATE_USES.items():
        with pytest.raises(replayq.ContextEndedError) as refused:
            late(ctx)
        message = str(refused.value)
        assert f"attempt (job {job_id}, attempt {attempt}) has ended" in message, (use, message)
    assert ctx.cancelled, "a loop in a thread that polls ctx.cancelled stops"


@pytest.mark.parametrize("grouped", [False, True], ids=["execute", "group_commit"])
def test_a_ctx_kept_past_its_attempt_refuses_every_view_and_verb_and_records_nothing(
    app_factory: AppFactory, db_url: str, grouped: bool
) -> None:
    """A handler keeps ``ctx``; the test uses it once the job has succeeded, whether its
    ack committed at once (``execute``) or with a running worker's group commit."""
    app = app_factory()
    kept: list[replayq.Context] = []
    keeping_app(app, kept)
    job_id = app.enqueue("keeps", {"n": 1})
    if grouped:
        stats = replayq.Worker(app, burst=True, worker_id="w1").run()
        assert stats.succeeded == 1
    else:
        run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    events = len(app.trace(job_id))

    [ctx] = kept
    assert_refused_after_the_attempt(ctx, job_id)

    assert len(app.trace(job_id)) == events, "the late uses recorded nothing"
    assert not app.state.get("order", "late").exists
    assert count_rows(db_url, "rq_outbox") == 0
    assert count_rows(db_url, "rq_jobs") == 1, "no child job"


def test_a_ctx_kept_from_an_attempt_whose_settle_raised_refuses_too(
    app_factory: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler failed and its settle raised (the database failed there: the job stays
    running, to be reaped): the attempt is over all the same, and its ``ctx`` refuses."""
    app = app_factory()
    kept: list[replayq.Context] = []

    @app.job("keeps_and_fails", retry=replayq.Retry(max_attempts=1))
    def keeps_and_fails(ctx: replayq.Context) -> None:
        kept.append(ctx)
        raise ValueError("the handler failed")

    job_id = app.enqueue("keeps_and_fails", {})
    worker = replayq.Worker(app, worker_id="w1")

    def settle_fails(*args: Any, **kwargs: Any) -> None:
        raise replayq.StorageError("the database failed in the settle")

    monkeypatch.setattr(worker, "_fail", settle_fails)
    [job] = worker.lease(1)
    with pytest.raises(replayq.StorageError, match="failed in the settle"):
        worker.execute(job)
    assert app.get_job(job_id).state == replayq.JobState.RUNNING, "left to be reaped"
    [ctx] = kept
    assert_refused_after_the_attempt(ctx, job_id)


@pytest.mark.parametrize("mode", ["dry_run", "rerun"])
def test_a_ctx_kept_from_a_replay_refuses_once_the_replay_returned(
    app_factory: AppFactory, mode: str
) -> None:
    app = app_factory()
    kept: list[replayq.Context] = []
    keeping_app(app, kept)
    job_id = app.enqueue("keeps", {"n": 1})
    run_once(replayq.Worker(app, worker_id="w1"))

    if mode == "dry_run":
        assert dry_run(app, job_id).outcome_now.status == "succeeded"
    else:
        assert rerun(app, job_id, allow_effects=["none"]).outcome.status == "succeeded"
    _, replayed = kept
    assert replayed is not kept[0]
    assert_refused_after_the_attempt(replayed, job_id, replayed.attempt)


def test_a_ctx_kept_from_a_quick_dry_run_refuses_once_the_run_returned(
    app_factory: AppFactory,
) -> None:
    """A bulk dry-run that keeps nothing checks a job it covers in memory (``quick.py``): its
    ``ctx`` is no ``Context``, and kept, it refused with the quick run's own
    ``QuickCheckStopped`` while ``ctx.cancelled`` read False. It ends as a ``Context`` does."""
    app = app_factory()
    kept: list[Any] = []

    @app.job("decides")
    def decides(ctx: replayq.Context, n: int) -> None:
        with ctx.step("decide"):
            ctx.decide("ship", n > 0)
        kept.append(ctx)

    job_id = app.enqueue("decides", {"n": 1})
    run_once(replayq.Worker(app, worker_id="w1"))
    [report] = dry_run_many(app, [job_id], keep=False)
    assert report.matched_in_memory, "checked by the quick run"
    _, replayed = kept
    for late in (
        lambda: replayed.decide("late", True),
        lambda: replayed.step("late").__enter__(),
        lambda: replayed.state.put("order", "late", {"paid": True}),
        replayed.check_cancelled,
    ):
        with pytest.raises(replayq.ContextEndedError, match=f"job {job_id}, attempt 1"):
            late()
    assert replayed.cancelled, "a loop in a thread that polls ctx.cancelled stops"
