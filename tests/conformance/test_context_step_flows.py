"""What a step's commit takes when other threads or tasks of its attempt write too
(``Recorder._running``: each flow's outermost step holds its writes until it ends).

A write made inside a step by a thread or task the step itself started (and waited for)
still commits with the step, in the order it was made; a lock let go of in a step whose
writes under it wait keeps the lock until those writes commit, whichever other commit
comes first; a cache write of a step still running at the ack is not made by the ack.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import replayq
from tests.context_support import run_once

AppFactory = Callable[..., replayq.App]


def test_a_write_a_steps_own_thread_made_commits_after_the_steps_earlier_write(
    app_factory: AppFactory,
) -> None:
    """A step writes ``orders:1`` (v1), then a thread it waits for writes v2 on top of it:
    the step's commit writes v1 then v2 (before the fix: v2 first, refused as a version
    conflict, and the step failed)."""
    app = app_factory()

    @app.job("fans_out", retry=replayq.Retry(max_attempts=1))
    def fans_out(ctx: replayq.Context) -> None:
        with ctx.step("s"):
            ctx.state.put("orders", 1, {"n": 1})
            helper = threading.Thread(target=lambda: ctx.state.put("orders", 1, {"n": 2}))
            helper.start()
            helper.join()

    job_id = app.enqueue("fans_out", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    entity = app.state.get("orders", 1)
    assert (entity.version, entity.data) == (2, {"n": 2})


def test_a_write_a_steps_own_task_made_commits_after_the_steps_earlier_write(
    app_factory: AppFactory,
) -> None:
    """As above in an ``async def`` handler: the step gathers a coroutine that writes
    (``asyncio.gather`` runs it in a task of its own)."""
    app = app_factory()

    @app.job("gathers", retry=replayq.Retry(max_attempts=1))
    async def gathers(ctx: replayq.Context) -> None:
        async def bump() -> None:
            ctx.state.put("orders", 1, {"n": 2})

        with ctx.step("s"):
            ctx.state.put("orders", 1, {"n": 1})
            await asyncio.gather(bump())

    job_id = app.enqueue("gathers", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    entity = app.state.get("orders", 1)
    assert (entity.version, entity.data) == (2, {"n": 2})
