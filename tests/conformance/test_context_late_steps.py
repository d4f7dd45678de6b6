"""A ``ctx.step`` whose body outlives its handler (run in a thread the handler left
running) commits nothing into the attempt's trace once the attempt ended, on every
backend: the step's end raises ``ContextEndedError`` and is logged.

``ctx.step`` looked at the end only on entry. Before: a callable step whose ``fn``
returned after the ack committed its ledger row fenced, found the lease gone and
committed ``write.fenced``, ``step.rolled_back`` and a failed ``step.finished`` into the
settled attempt's trace; a step block that raised after the ack committed its failed
``step.finished``; a step that ended while the ack waited for its group commit committed
its ``step.finished`` and ledger row before that ack.

A write such a step made through ``ctx.state`` before the end is dropped: neither the ack
nor another thread's step commit takes it (before: it waited with the attempt's other
writes and committed with whichever commit came next, although its step never finished).

Each window is hit every time: the step bodies block on events the test sets, never on
sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.replay.engine import dry_run
from tests.context_support import Held, one_batch_worker, run_once

AppFactory = Callable[..., replayq.App]


class _Body(Held):
    """A step body that starts, then waits for the test before it returns or raises."""

    def run(self) -> dict[str, int]:
        self.hold("the step")
        if self.outcome == "raises":
            raise ValueError("late step failed")
        return {"n": 1}

    def in_thread(self, use: Callable[[], Any]) -> None:
        threading.Thread(target=self.watched(use), daemon=True).start()
        assert self.started.wait(30), "the step never started"


def _step(ctx: replayq.Context, body: _Body, form: str) -> Any:
    if form == "callable":
        return ctx.step("late", body.run)
    with ctx.step("late"):
        return body.run()


def _ledger(app: replayq.App, job_id: int) -> list[str]:
    with app.storage.transaction(readonly=True) as tx:
        return [row.step_key for row in tx.step_by_job(job_id)]


@pytest.mark.parametrize("form", ["callable", "block"])
@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_step_that_ends_after_the_ack_leaves_the_trace_alone(
    app_factory: AppFactory, form: str, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_factory()
    body = _Body(outcome)

    @app.job("leaves")
    def leaves(ctx: replayq.Context) -> None:
        body.in_thread(lambda: _step(ctx, body, form))

    job_id = app.enqueue("leaves", {})
    worker = replayq.Worker(app, worker_id="w1")
    with caplog.at_level(logging.WARNING, logger="replayq.recording"):
        run_once(worker)
        assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
        events = [e.name for e in app.trace(job_id)]
        body.finish.set()
        assert body.done.wait(30), "the late step never ended"

    trace = [e.name for e in app.trace(job_id)]
    assert trace == events, "nothing recorded into the attempt's trace after its end"
    assert trace[-1] == "job.succeeded"
    assert not {"step.finished", "step.rolled_back", "write.fenced"} & set(trace), trace
    assert _ledger(app, job_id) == []
    late = [r.getMessage() for r in caplog.records if "after the attempt ended" in r.getMessage()]
    assert len(late) == 1 and "'late'" in late[0], late
    [seen] = body.seen
    assert isinstance(seen, replayq.ContextEndedError), seen
    assert f"job {job_id}, attempt 1" in str(seen)


def test_a_step_that_ends_before_the_group_commit_is_not_in_its_trace(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A running worker (group commit on): ``keeps`` leaves a callable step running in a
    thread and returns; its ack waits in memory while the next job of the batch runs, and
    that job lets the step end and waits for it. The step is refused: neither its
    ``step.finished`` nor its ledger row commits (before: both, ahead of the ack)."""
    app = app_factory()
    body = _Body("returns")

    @app.job("keeps")
    def keeps(ctx: replayq.Context) -> None:
        ctx.decide("go", True)  # pending: it commits with the ack
        body.in_thread(lambda: ctx.step("late", body.run))

    @app.job("next_in_batch")
    def next_in_batch(ctx: replayq.Context) -> None:
        body.finish.set()  # ``keeps`` returned; its ack waits for the group commit
        assert body.done.wait(30), "the late step never ended"

    keeping = app.enqueue("keeps", {})
    app.enqueue("next_in_batch", {})
    worker = one_batch_worker(app)
    with caplog.at_level(logging.WARNING, logger="replayq.recording"):
        stats = worker.run()
    assert stats.succeeded == 2
    names = [e.name for e in app.trace(keeping)]
    assert "step.finished" not in names, names
    assert names.count("decision") == 1 and names[-1] == "job.succeeded", names
    assert _ledger(app, keeping) == []
    logged = [r.getMessage() for r in caplog.records if "after the attempt ended" in r.getMessage()]
    assert len(logged) == 1, logged
    [seen] = body.seen
    assert isinstance(seen, replayq.ContextEndedError), seen


class _Writer(_Body):
    """A step body that writes ``orders:<n>`` through ``ctx.state`` at once, then waits for
    the test before it returns or raises: its write is pending while it waits."""

    def __init__(self, ctx_of: Callable[[], replayq.Context], outcome: str, n: int = 1) -> None:
        super().__init__(outcome)
        self.ctx_of, self.n = ctx_of, n

    def run(self) -> dict[str, int]:
        self.ctx_of().state.put("orders", self.n, {"n": self.n})
        return super().run()


@pytest.mark.parametrize("form", ["callable", "block"])
def test_a_step_running_at_the_ack_has_its_writes_dropped(
    app_factory: AppFactory, form: str
) -> None:
    """A step left running in a thread wrote through ``ctx.state`` before the handler
    returned; the ack commits the handler's own write, not the half-done step's (before:
    the step's pending write committed with the ack although the step never finished)."""
    app = app_factory()
    kept: list[replayq.Context] = []
    body = _Writer(lambda: kept[0], "returns")

    @app.job("leaves_a_write")
    def leaves_a_write(ctx: replayq.Context) -> None:
        kept.append(ctx)
        body.in_thread(lambda: _step(ctx, body, form))
        ctx.state.put("customers", 7, {"seen": True})  # the handler's own: it commits

    job_id = app.enqueue("leaves_a_write", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    assert app.state.get("customers", 7).version == 1
    assert app.state.get("orders", 1).version == 0, "a running step's write committed"
    body.finish.set()
    assert body.done.wait(30), "the late step never ended"
    [seen] = body.seen
    assert isinstance(seen, replayq.ContextEndedError), seen
    assert app.state.get("orders", 1).version == 0, "the late step's write committed"
    assert _ledger(app, job_id) == []
    # The trace keeps what the step did before the end (its write as recorded), and no end.
    trace = app.trace(job_id)
    assert [e.resource for e in trace if e.name == "state.write"] == ["orders:1", "customers:7"]
    assert "step.finished" not in [e.name for e in trace]


def test_a_step_running_at_the_group_commit_has_its_writes_dropped(
    app_factory: AppFactory,
) -> None:
    """A running worker (group commit on): ``keeps`` leaves a step running in a thread
    with a write pending and returns; its ack waits while the next job runs and lets the
    step end. Neither the ack nor the step commits the step's write."""
    app = app_factory()
    kept: list[replayq.Context] = []
    body = _Writer(lambda: kept[0], "returns")

    @app.job("keeps")
    def keeps(ctx: replayq.Context) -> None:
        kept.append(ctx)
        body.in_thread(lambda: ctx.step("late", body.run))

    @app.job("next_in_batch")
    def next_in_batch(ctx: replayq.Context) -> None:
        body.finish.set()  # ``keeps`` returned; its ack waits for the group commit
        assert body.done.wait(30), "the late step never ended"

    keeping = app.enqueue("keeps", {})
    app.enqueue("next_in_batch", {})
    stats = one_batch_worker(app).run()
    assert stats.succeeded == 2
    assert app.state.get("orders", 1).version == 0, "the late step's write committed"
    assert _ledger(app, keeping) == []


def test_a_step_commit_leaves_another_threads_running_step_alone(
    app_factory: AppFactory,
) -> None:
    """Two steps run at once, one in a thread the handler waits for: the handler's step
    commits its own write, not the thread's pending one, and the thread's step, which
    then raises, has its write dropped (before: the handler's step committed it)."""
    app = app_factory()
    kept: list[replayq.Context] = []
    body = _Writer(lambda: kept[0], "raises")

    @app.job("two_at_once")
    def two_at_once(ctx: replayq.Context) -> None:
        kept.append(ctx)
        body.in_thread(lambda: ctx.step("theirs", body.run))
        with ctx.step("mine"):
            ctx.state.put("customers", 7, {"seen": True})
        body.finish.set()
        assert body.done.wait(30), "the thread's step never ended"

    job_id = app.enqueue("two_at_once", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    [seen] = body.seen
    assert isinstance(seen, ValueError), seen
    assert app.state.get("customers", 7).version == 1
    assert app.state.get("orders", 1).version == 0, "a failed step's write committed"


def test_a_task_left_in_a_step_at_the_ack_has_its_writes_dropped(
    app_factory: AppFactory,
) -> None:
    """An ``async def`` handler leaves a task running in a step that wrote through
    ``ctx.state``, on the worker's loop, and returns: the ack commits the handler's own
    write (made in its own task, outside steps), not the task's step's."""
    app = app_factory()
    body = _Body("returns")

    async def late_step(ctx: replayq.Context) -> None:
        try:
            with ctx.step("late"):
                ctx.state.put("orders", 1, {"n": 1})
                body.started.set()
                await asyncio.get_running_loop().run_in_executor(None, body.finish.wait, 30)
        except BaseException as exc:
            body.seen.append(exc)
        finally:
            body.done.set()

    tasks: list[asyncio.Task[None]] = []

    @app.job("leaves_a_task")
    async def leaves_a_task(ctx: replayq.Context) -> None:
        tasks.append(asyncio.create_task(late_step(ctx)))
        await asyncio.sleep(0)  # the task runs to its first wait: its write is pending
        assert body.started.is_set()
        ctx.state.put("customers", 7, {"seen": True})

    job_id = app.enqueue("leaves_a_task", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    assert app.state.get("customers", 7).version == 1
    assert app.state.get("orders", 1).version == 0, "a running step's write committed"
    body.finish.set()
    assert body.done.wait(30), "the late step never ended"
    [seen] = body.seen
    assert isinstance(seen, replayq.ContextEndedError), seen
    assert app.state.get("orders", 1).version == 0, "the late step's write committed"


def test_a_step_running_at_the_ack_is_recorded_abandoned_and_its_write_uncommitted(
    app_factory: AppFactory,
) -> None:
    """A thread left in a step (and a step nested in it) that wrote through ``ctx.state``:
    the attempt's trace ends that step with ``step.abandoned`` (committed with the ack),
    naming the steps left open, and ``uncommitted_writes`` (``trace show``) says its write
    never committed (before: the step stayed open in the trace and its write looked
    committed). A dry-run that leaves the step running the same way agrees with the
    recording: when a step outlives its attempt is not compared."""
    app = app_factory()
    gates: list[tuple[threading.Event, threading.Event, threading.Event]] = []

    def late(
        ctx: replayq.Context,
        started: threading.Event,
        finish: threading.Event,
        done: threading.Event,
    ) -> None:
        try:
            with ctx.step("late"):
                ctx.state.put("orders", 1, {"n": 1})
                with ctx.step("inner"):
                    started.set()
                    assert finish.wait(30)
        except replayq.ContextEndedError:
            pass
        finally:
            done.set()

    @app.job("leaves_a_step")
    def leaves_a_step(ctx: replayq.Context) -> None:
        gate = (threading.Event(), threading.Event(), threading.Event())
        gates.append(gate)
        threading.Thread(target=late, args=(ctx, *gate), daemon=True).start()
        assert gate[0].wait(30), "the step never started"
        ctx.state.put("customers", 7, {"seen": True})

    def release_all() -> None:
        for _, finish, done in gates:
            finish.set()
            assert done.wait(30), "the late step never ended"

    job_id = app.enqueue("leaves_a_step", {})
    try:
        run_once(replayq.Worker(app, worker_id="w1"))
    finally:
        release_all()
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    trace = app.trace(job_id)
    [abandoned] = [e for e in trace if e.name == "step.abandoned"]
    assert (abandoned.status, abandoned.step) == ("abandoned", None)
    assert abandoned.data["step_name"] == "late" and abandoned.data["step_key"] == "late"
    assert abandoned.data["open_steps"] == ["late", "inner"]
    names = [e.name for e in trace]
    assert names.index("step.abandoned") < names.index("job.succeeded")
    assert "step.finished" not in names
    dropped = replayq.uncommitted_writes(trace)
    writes = {
        e.resource: dropped.get((e.trace_id, e.attempt, e.seq))
        for e in trace
        if e.name == "state.write"
    }
    assert writes == {
        "orders:1": "not committed (its step still ran when the attempt ended)",
        "customers:7": None,
    }
    assert app.state.get("orders", 1).version == 0

    try:
        report = dry_run(app, job_id)
    finally:
        release_all()
    assert not report.diverged, report.to_dict()
    assert [e.name for e in report.events_now].count("step.abandoned") == 1


def test_a_write_a_nested_step_committed_before_its_step_was_abandoned_shows_committed(
    app_factory: AppFactory,
) -> None:
    """A thread's step writes, a step nested in it ends (its commit takes that write: a
    thread's steps hold their writes together), the step writes again and is still
    running at the ack: recorded ``step.abandoned``. ``uncommitted_writes`` shows the
    second write dropped and the first committed, as the database has them (before the
    fix: both dropped, the first judged by its own step's end alone)."""
    app = app_factory()
    started, finish, done = threading.Event(), threading.Event(), threading.Event()

    def late(ctx: replayq.Context) -> None:
        try:
            with ctx.step("late"):
                ctx.state.put("orders", 1, {"n": 1})
                with ctx.step("inner"):
                    pass
                ctx.state.put("orders", 2, {"n": 2})
                started.set()
                assert finish.wait(30)
        except replayq.ContextEndedError:
            pass
        finally:
            done.set()

    @app.job("leaves_a_step_after_a_commit")
    def leaves(ctx: replayq.Context) -> None:
        threading.Thread(target=late, args=(ctx,), daemon=True).start()
        assert started.wait(30), "the step never wrote"

    job_id = app.enqueue("leaves_a_step_after_a_commit", {})
    try:
        run_once(replayq.Worker(app, worker_id="w1"))
    finally:
        finish.set()
        assert done.wait(30), "the late step never ended"
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    trace = app.trace(job_id)
    [abandoned] = [e for e in trace if e.name == "step.abandoned"]
    assert abandoned.data["open_steps"] == ["late"]
    dropped = replayq.uncommitted_writes(trace)
    shown = {
        e.resource: dropped.get((e.trace_id, e.attempt, e.seq))
        for e in trace
        if e.name == "state.write"
    }
    assert (app.state.get("orders", 1).version, app.state.get("orders", 2).version) == (1, 0)
    assert shown == {
        "orders:1": None,
        "orders:2": "not committed (its step still ran when the attempt ended)",
    }
