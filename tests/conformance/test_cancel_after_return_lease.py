"""A cancel that reaches the worker after the handler returned, while the ack waits for
its group commit, leaves the attempt succeeded however long the ack waits, on every
backend.

The heartbeat extends no lease of a job asked to stop (a handler that reaches no step
boundary within it is cancelled by the reaper). That held for a job whose handler had
already returned and whose ack waited in memory (``ack_window``, or the executor busy
with the next job of its batch): its lease ran out, the reaper cancelled the job, and
the ack was then refused, the completed attempt ending ``cancelled`` with its writes
dropped, although a cancel after the return is too late (``job.succeeded`` with
``cancel_too_late``: docs/reliability.md). Now an acking job's lease is still extended.

The jobs wait on events the test sets; the one sleep is the lease running out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import replayq

AppFactory = Callable[..., replayq.App]
LEASE = 1.0


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_late_cancel_while_the_ack_waits_past_the_lease_leaves_the_job_succeeded(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    returned, slow_started, go = threading.Event(), threading.Event(), threading.Event()

    @app.job("quick", lease=f"{LEASE}s", heartbeat="0.1s")
    def quick(ctx: replayq.Context) -> str:
        ctx.state.put("order", "o1", {"done": True})  # outside a step: commits with the ack
        returned.set()
        return "done"

    @app.job("slow", lease="30s", heartbeat="0.1s")
    def slow(ctx: replayq.Context) -> None:
        slow_started.set()
        assert go.wait(30), "the test never let the slow job end"

    quick_id = app.enqueue("quick", {})
    app.enqueue("slow", {})
    # Both leased in one batch; the quick job's ack waits in memory while the executor
    # runs the slow one (no refill, and the window is long).
    worker = replayq.Worker(
        app,
        concurrency=1,
        prefetch=1,
        prefetch_window=float("inf"),
        ack_window=60.0,
        poll_interval=0.02,
        reap_interval=0.1,
        grace_period=10,
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        assert returned.wait(20) and slow_started.wait(20), "the jobs never ran"
        assert app.get_job(quick_id).state is replayq.JobState.RUNNING  # its ack waits
        assert app.cancel(quick_id)
        time.sleep(LEASE * 3)  # the heartbeat sees the request; the lease would run out
        go.set()
        _wait_for(
            lambda: app.get_job(quick_id).state is not replayq.JobState.RUNNING,
            timeout=20,
            what="the quick job to settle",
        )
    finally:
        go.set()
        worker.stop()
        runner.join(20)
    job = app.get_job(quick_id)
    assert job.state is replayq.JobState.SUCCEEDED, (job.state, job.last_error)
    events = app.trace(quick_id)
    (succeeded,) = [e for e in events if e.name == "job.succeeded"]
    assert succeeded.data["cancel_too_late"] is True
    assert app.state.get("order", "o1").data == {"done": True}
