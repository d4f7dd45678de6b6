"""A ``ctx`` lives as long as its handler call, on every backend: kept past it (a thread,
a closure called later, an awaitable awaited later), every view (also one kept in a
variable), every verb and ``ctx.now/random/uuid`` refuse with ``ContextEndedError``
naming the attempt, and nothing of the late use is recorded or written. It ends when the
handler returns, before the ack is handed to the group commit, and on every path of a
replay or rerun.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.replay.bulk import dry_run_many
from replayq.replay.engine import dry_run, fork
from replayq.replay.rerun import rerun
from tests.context_support import count_rows, one_batch_worker, run_once

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
    # Recorded nondeterminism: its value would be recorded into a trace never committed.
    "ctx.now": lambda ctx: ctx.now(),
    "ctx.random": lambda ctx: ctx.random(),
    "ctx.uuid": lambda ctx: ctx.uuid(),
}

# Each view the handler kept in a variable (``s = ctx.state``), used after its attempt;
# ``lock`` is a handle made by ``ctx.lock`` in the attempt, entered only later.
LATE_VIEW_USES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "state.get": lambda views: views["state"].get("order", "late"),
    "state.get (its own write)": lambda views: views["state"].get("order", "1"),
    "state.put": lambda views: views["state"].put("order", "late", {"paid": True}),
    "state.history": lambda views: views["state"].history("order", "1"),
    "cache.get": lambda views: views["cache"].get("price", "late"),
    "cache.set": lambda views: views["cache"].set("price", "late", 1),
    "cache.invalidate": lambda views: views["cache"].invalidate("price", "late"),
    "cache.key": lambda views: views["cache"].key("price", "late"),
    "outbox.publish": lambda views: views["outbox"].publish("orders.late", {"id": 1}),
    "effects.run": lambda views: views["effects"].run("late.send", lambda: 1, key="late"),
    "locks.handle": lambda views: views["locks"].handle("late"),
    "with a lock handle": lambda views: views["lock"].__enter__(),
}


def keeping_app(
    app: replayq.App, kept: list[replayq.Context], views: list[dict[str, Any]] | None = None
) -> None:
    """Declare ``keeps``: a handler that builds its views, keeps its ``ctx`` and (into
    ``views``) each view in a variable, and a lock handle it never entered."""

    @app.job("keeps")
    def keeps(ctx: replayq.Context, n: int) -> None:
        with ctx.step("write"):
            ctx.state.put("order", str(n), {"n": n})  # the state view, built in the attempt
            ctx.cache.get("price", str(n))  # and the cache view
        kept.append(ctx)
        if views is not None:
            views.append(
                {
                    "state": ctx.state,
                    "cache": ctx.cache,
                    "outbox": ctx.outbox,
                    "effects": ctx.effects,
                    "locks": ctx.locks,
                    "lock": ctx.lock("late"),
                }
            )


def assert_refused_after_the_attempt(
    ctx: replayq.Context, job_id: int, attempt: int = 1, views: dict[str, Any] | None = None
) -> None:
    uses: dict[str, Callable[[], Any]] = {
        use: (lambda late=late: late(ctx)) for use, late in LATE_USES.items()
    }
    if views is not None:
        uses.update({use: (lambda late=late: late(views)) for use, late in LATE_VIEW_USES.items()})
    for use, late in uses.items():
        with pytest.raises(replayq.ContextEndedError) as refused:
            late()
        message = str(refused.value)
        assert f"attempt (job {job_id}, attempt {attempt}) has ended" in message, (use, message)
    assert ctx.cancelled, "a loop in a thread that polls ctx.cancelled stops"
    # Plain reads of what the attempt was given stay allowed: nothing is recorded by them.
    assert ctx.job.id == job_id and ctx.job_id == job_id and ctx.attempt == attempt
    assert ctx.payload == ctx.job.payload


@pytest.mark.parametrize("grouped", [False, True], ids=["execute", "group_commit"])
def test_a_ctx_kept_past_its_attempt_refuses_every_view_and_verb_and_records_nothing(
    app_factory: AppFactory, db_url: str, grouped: bool
) -> None:
    """A handler keeps ``ctx``; the test uses it once the job has succeeded, whether its
    ack committed at once (``execute``) or with a running worker's group commit."""
    app = app_factory()
    kept: list[replayq.Context] = []
    views: list[dict[str, Any]] = []
    keeping_app(app, kept, views)
    job_id = app.enqueue("keeps", {"n": 1})
    if grouped:
        stats = replayq.Worker(app, burst=True, worker_id="w1").run()
        assert stats.succeeded == 1
    else:
        run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    events = len(app.trace(job_id))

    [ctx] = kept
    assert_refused_after_the_attempt(ctx, job_id, views=views[0])

    assert len(app.trace(job_id)) == events, "the late uses recorded nothing"
    assert not app.state.get("order", "late").exists
    assert all(lock.resource != "late" for lock in replayq.list_locks(app)), "no lock taken"
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
    views: list[dict[str, Any]] = []
    keeping_app(app, kept, views)
    job_id = app.enqueue("keeps", {"n": 1})
    run_once(replayq.Worker(app, worker_id="w1"))

    if mode == "dry_run":
        assert dry_run(app, job_id).outcome_now.status == "succeeded"
    else:
        assert rerun(app, job_id, allow_effects=["none"]).outcome.status == "succeeded"
    _, replayed = kept
    assert replayed is not kept[0]
    assert_refused_after_the_attempt(replayed, job_id, replayed.attempt, views[1])


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


def test_a_ctx_used_between_the_handlers_return_and_its_group_commit_is_refused(
    app_factory: AppFactory,
) -> None:
    """A running worker (threads, group commit on): job ``keeps`` starts a thread and
    returns; its ack waits in memory while the next job, leased in the same batch, runs.
    That job lets the thread use the kept ``ctx`` — after ``keeps`` returned, before its
    ack's group commit — and waits for it. Every use is refused, and ``keeps``'s committed
    trace has no event of them (before, they were recorded and committed with the ack,
    or not, by the race with its flush)."""
    app = app_factory()
    kept: list[replayq.Context] = []
    views: list[dict[str, Any]] = []
    go, done = threading.Event(), threading.Event()
    refused: dict[str, str] = {}

    def late_uses() -> None:
        go.wait(30)
        [ctx], [view] = kept, views
        uses: dict[str, Callable[[], Any]] = {
            "ctx.now": ctx.now,
            "ctx.uuid": ctx.uuid,
            "ctx.decide": lambda: ctx.decide("late", True),
            "ctx.call": lambda: ctx.call("late.read", lambda: 1),
            "ctx.state.put": lambda: ctx.state.put("order", "late", {"late": True}),
            "kept state view": lambda: view["state"].put("order", "late", {"late": True}),
            "kept outbox view": lambda: view["outbox"].publish("orders.late", {"id": 1}),
        }
        for use, late in uses.items():
            try:
                late()
            except replayq.ContextEndedError as exc:
                refused[use] = str(exc)
        done.set()

    @app.job("keeps_and_returns")
    def keeps_and_returns(ctx: replayq.Context) -> None:
        with ctx.step("write"):
            ctx.state.put("order", "1", {"n": 1})
        kept.append(ctx)
        views.append({"state": ctx.state, "outbox": ctx.outbox})
        threading.Thread(target=late_uses, daemon=True).start()

    @app.job("next_in_batch")
    def next_in_batch(ctx: replayq.Context) -> None:
        go.set()  # the kept ctx's handler returned; its ack waits for the group commit
        assert done.wait(30), "the thread's late uses did not finish"

    keeping = app.enqueue("keeps_and_returns", {})
    app.enqueue("next_in_batch", {})
    worker = one_batch_worker(app)
    stats = worker.run()
    assert stats.succeeded == 2
    assert done.is_set()
    assert sorted(refused) == sorted(
        [
            "ctx.now",
            "ctx.uuid",
            "ctx.decide",
            "ctx.call",
            "ctx.state.put",
            "kept state view",
            "kept outbox view",
        ]
    ), refused
    for message in refused.values():
        assert f"attempt (job {keeping}, attempt 1) has ended" in message
    trace = app.trace(keeping)
    late = [
        e
        for e in trace
        if e.name in ("clock.now", "random.uuid", "decision", "call", "outbox.written")
        or (e.name == "state.write" and e.resource == "order:late")
    ]
    assert late == [], "nothing of the late uses in the committed trace"
    assert [e.name for e in trace][-1] == "job.succeeded"
    assert not app.state.get("order", "late").exists


class Abandoned(BaseException):
    """Raised by a handler in a replay: not an ``Exception``, so it is not the run's
    outcome but goes through the replay engine, between the run and its end."""


def abandoning_app(app: replayq.App, kept: list[replayq.Context]) -> None:
    """``abandons``: succeeds on the worker; in a replay, fork or rerun (a derived trace)
    it keeps ``ctx`` and raises ``Abandoned`` out of the engine."""

    @app.job("abandons")
    def abandons(ctx: replayq.Context, n: int) -> None:
        with ctx.step("write"):
            ctx.state.put("order", str(n), {"n": n})
        if not ctx.owns_job_trace:
            kept.append(ctx)
            raise Abandoned


@pytest.mark.parametrize("mode", ["dry_run", "fork", "rerun"])
def test_a_replay_that_raises_out_of_the_engine_ends_and_releases_its_ctx(
    app_factory: AppFactory, mode: str
) -> None:
    """Between the handler's run and the end of a replay, fork or rerun something raises
    through the engine (here the handler's own ``BaseException``): its ``ctx`` is ended
    and released all the same, where before it stayed usable."""
    app = app_factory()
    kept: list[replayq.Context] = []
    abandoning_app(app, kept)
    job_id = app.enqueue("abandons", {"n": 1})
    run_once(replayq.Worker(app, worker_id="w1"))

    with pytest.raises(Abandoned):
        if mode == "dry_run":
            dry_run(app, job_id)
        elif mode == "fork":
            fork(app, job_id, from_step="write")
        else:
            rerun(app, job_id, allow_effects=["none"])
    [ctx] = kept
    assert_refused_after_the_attempt(ctx, job_id, ctx.attempt)
    # Released (``Context.release``): the views built in it, which refer back to it, dropped.
    assert ctx._state is None


@pytest.mark.parametrize("verb", ["call", "effect"])
def test_an_awaitable_verb_of_an_async_handler_awaited_after_its_attempt_is_refused(
    app_factory: AppFactory, verb: str
) -> None:
    """An ``async def`` handler makes ``ctx.call(...)`` / ``ctx.effect(...)`` with a coroutine
    function and keeps the awaitable instead of awaiting it. Awaited once the attempt is
    over, it refuses before anything runs or is recorded: the function is never called."""
    app = app_factory()
    kept: list[Any] = []
    ran: list[str] = []

    async def outside() -> int:
        ran.append(verb)
        return 1

    @app.job("keeps_awaitable")
    async def keeps_awaitable(ctx: replayq.Context) -> None:
        with ctx.step("write"):
            ctx.state.put("order", "1", {"n": 1})
        if verb == "call":
            kept.append(ctx.call("late.read", outside))
        else:
            kept.append(ctx.effect("late.send", outside, key="late"))

    job_id = app.enqueue("keeps_awaitable", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    events = len(app.trace(job_id))

    [awaitable] = kept
    with pytest.raises(replayq.ContextEndedError, match=f"job {job_id}, attempt 1"):
        asyncio.run(awaitable)
    assert ran == [], "the outside function never ran"
    assert len(app.trace(job_id)) == events, "nothing recorded"
    assert app.effects() == [], "no idempotency record claimed"
