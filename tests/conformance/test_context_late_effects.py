"""A ``ctx.call`` or ``ctx.effect`` whose outside call outlives its handler (run in a thread
or an ``asyncio`` task the handler left running) records nothing into the attempt's trace
once the attempt ended, on every backend; the late outcome is logged, and an effect's
idempotency record still says what happened.

Before: a late effect committed ``effect.succeeded`` into the trace while the ack waited
for its group commit (with whatever pending events of the attempt rode along), and after
the ack its fenced result was refused, the record left ``started`` — in doubt, so the next
job with the key was parked although the effect was known to have happened; a late
``ctx.call`` failure was recorded into the attempt and committed with its ack.

Each window is hit every time: the outside calls block on events the test sets, never on
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
from tests.context_support import Held, one_batch_worker, run_once

AppFactory = Callable[..., replayq.App]


def _in_background(runner: str, ctx: replayq.Context, use: Callable[[], Any]) -> None:
    """Start ``use`` (a ``ctx`` verb) in a thread; or, for ``task``, the awaitable it returns
    in a task on the handler's running loop (the handler must be ``async``)."""
    if runner == "thread":
        threading.Thread(target=use, daemon=True).start()
    else:
        asyncio.get_running_loop().create_task(use())


class _Outside(Held):
    """An outside function that starts, then waits for the test before it ends."""

    def plain(self) -> dict[str, str]:
        self.hold("the outside call")
        if self.outcome == "fails":
            raise replayq.DependencyError("mail server went away")
        return {"message_id": "m-1"}

    async def awaited(self) -> dict[str, str]:
        self.started.set()
        await asyncio.get_running_loop().run_in_executor(None, self.finish.wait, 30)
        if self.outcome == "fails":
            raise replayq.DependencyError("mail server went away")
        return {"message_id": "m-1"}

    def watched_awaited(self, use: Callable[[], Any]) -> Callable[[], Any]:
        """``watched`` for a ``use`` that returns an awaitable: a coroutine function."""

        async def watching() -> None:
            try:
                self.seen.append(await use())
            except BaseException as exc:
                self.seen.append(exc)
            finally:
                self.done.set()

        return watching


@pytest.mark.parametrize("runner", ["thread", "task"])
@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_an_effect_that_ends_after_the_ack_leaves_its_record_settled_and_the_trace_alone(
    app_factory: AppFactory, runner: str, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler leaves ``ctx.effect`` running (claimed, its outside call under way) and
    returns; the job is acked. Then the outside call ends: the trace of the attempt gets
    nothing more (no ``effect.succeeded``/``effect.failed``, no ``write.fenced``), the code
    that waited gets ``ContextEndedError``, the log says what happened, and the record says
    ``succeeded`` with its result (a later job with the key reuses it, never parked) or
    ``failed``. Before, the record stayed ``started``: in doubt."""
    app = app_factory()
    outside = _Outside(outcome)

    def send(ctx: replayq.Context) -> Any:
        fn = outside.plain if runner == "thread" else outside.awaited
        return ctx.effect("email.send", fn, key="email:1")

    if runner == "thread":

        @app.job("notify")
        def notify(ctx: replayq.Context) -> None:
            _in_background(runner, ctx, outside.watched(lambda: send(ctx)))
            assert outside.started.wait(30), "the effect never started"

    else:

        @app.job("notify")
        async def notify_async(ctx: replayq.Context) -> None:
            _in_background(runner, ctx, outside.watched_awaited(lambda: send(ctx)))
            await asyncio.get_running_loop().run_in_executor(None, outside.started.wait, 30)

    sent_again: list[str] = []

    @app.job("notify_again")
    def notify_again(ctx: replayq.Context) -> Any:
        return ctx.effect("email.send", lambda: sent_again.append("m-2"), key="email:1")

    job_id = app.enqueue("notify", {})
    worker = replayq.Worker(app, worker_id="w1")
    with caplog.at_level(logging.WARNING, logger="replayq.recording"):
        run_once(worker)
        assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
        events = [e.name for e in app.trace(job_id)]
        outside.finish.set()
        assert outside.done.wait(30), "the late effect never ended"

    trace = [e.name for e in app.trace(job_id)]
    assert trace == events, "nothing recorded into the attempt's trace after its end"
    assert "effect.claimed" in trace and trace[-1] == "job.succeeded"
    assert not {"effect.succeeded", "effect.failed", "write.fenced"} & set(trace)
    [record] = app.effects()
    assert record.status != "started", "the effect's outcome is not left in doubt"
    late = [r.getMessage() for r in caplog.records if "after the attempt ended" in r.getMessage()]
    assert len(late) == 1 and "email.send" in late[0], late

    if outcome == "succeeds":
        assert record.status == "succeeded" and not record.in_doubt
        assert record.result == {"message_id": "m-1"}
        assert "its idempotency record says succeeded" in late[0]
        # The key's next job reuses the outcome: the effect is not made again, nor parked.
        again = app.enqueue("notify_again", {})
        run_once(worker)
        assert app.get_job(again).state == replayq.JobState.SUCCEEDED
        assert sent_again == []
        assert app.get_job(again).result == {"message_id": "m-1"}
    else:
        assert record.status == "failed" and not record.in_doubt
        assert "mail server went away" in (record.error or "")
        assert "its idempotency record says failed" in late[0]
    # What waited for the late effect is told that its attempt had ended.
    [seen] = outside.seen
    assert isinstance(seen, replayq.ContextEndedError), seen
    assert f"job {job_id}, attempt 1" in str(seen)


def test_a_call_and_an_effect_that_end_before_the_group_commit_are_not_in_its_trace(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A running worker (group commit on): ``keeps`` leaves a ``ctx.call`` and a
    ``ctx.effect`` running in threads and returns; its ack waits in memory while the
    next job of the batch runs, and that job lets both outside calls end (the call
    failing, the effect succeeding) and waits for them. Both are refused; the ack's
    commit has neither (before: the call's failure was recorded into the attempt and
    committed with the ack, and the effect committed ``effect.succeeded``)."""
    app = app_factory()
    call = _Outside("fails")
    effect = _Outside("succeeds")

    @app.job("keeps")
    def keeps(ctx: replayq.Context) -> None:
        with ctx.step("write"):
            ctx.state.put("order", "1", {"n": 1})
        ctx.decide("notify", True)  # pending: it commits with the ack
        _in_background("thread", ctx, call.watched(lambda: ctx.call("mail.status", call.plain)))
        _in_background(
            "thread",
            ctx,
            effect.watched(lambda: ctx.effect("email.send", effect.plain, key="email:1")),
        )
        assert call.started.wait(30) and effect.started.wait(30)

    @app.job("next_in_batch")
    def next_in_batch(ctx: replayq.Context) -> None:
        # ``keeps`` returned; its ack waits for the group commit.
        call.finish.set()
        effect.finish.set()
        assert call.done.wait(30) and effect.done.wait(30), "the late calls never ended"

    keeping = app.enqueue("keeps", {})
    app.enqueue("next_in_batch", {})
    worker = one_batch_worker(app)
    with caplog.at_level(logging.WARNING, logger="replayq.recording"):
        stats = worker.run()
    assert stats.succeeded == 2
    trace = app.trace(keeping)
    names = [e.name for e in trace]
    assert "call" not in names, "the late call's failure is not in the trace"
    assert "effect.succeeded" not in names and "write.fenced" not in names
    assert names.count("decision") == 1, "the attempt's own pending events commit once"
    assert names[-1] == "job.succeeded"
    [record] = app.effects()
    assert record.status == "succeeded" and record.result == {"message_id": "m-1"}
    logged = [r.getMessage() for r in caplog.records if "after the attempt ended" in r.getMessage()]
    assert len(logged) == 2, logged
    for late in (call, effect):
        [seen] = late.seen
        assert isinstance(seen, replayq.ContextEndedError), seen
