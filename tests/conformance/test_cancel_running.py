"""Cancelling a running job on every backend: it stops at its next step boundary with its
committed steps kept and no further effect; one that reaches no boundary within its
lease is cancelled by the reaper and never runs twice at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import replayq
from tests.acceptance.workers import wait_for


@contextmanager
def running(app: replayq.App) -> Iterator[replayq.Worker]:
    worker = replayq.Worker(app, poll_interval=0.02, reap_interval=0.1, grace_period=5)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(10)


def test_a_running_job_cancelled_between_steps_ends_cancelled_with_its_steps_kept(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    effects: list[str] = []
    between_steps = threading.Event()

    def two_steps(ctx: replayq.Context) -> str:
        ctx.step("one", lambda: effects.append("one") or "done")
        between_steps.set()
        deadline = time.monotonic() + 10
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)  # work that is not a step: the heartbeat brings the cancel
        ctx.step("two", lambda: effects.append("two"))
        return "finished"

    app.job("two_steps", lease="2s", heartbeat="0.1s")(two_steps)
    job_id = app.enqueue("two_steps")
    with running(app) as worker:
        assert between_steps.wait(10)
        assert app.get_job(job_id).state == replayq.JobState.RUNNING
        assert app.cancel(job_id)
        wait_for(
            lambda: app.get_job(job_id).state == replayq.JobState.CANCELLED,
            timeout=10,
            what="the job ends cancelled",
        )
    assert effects == ["one"]
    assert worker.stats.cancelled == 1 and worker.stats.succeeded == 0
    events = app.trace(job_id)
    (cancelled,) = [e for e in events if e.name == "job.cancelled"]
    assert cancelled.data["committed_steps"] == ["one"]
    assert "two" not in {e.data.get("step_name") for e in events if e.name == "step.started"}
    assert app.get_job(job_id).attempt == 1  # never retried


def test_a_running_job_cancelled_between_effects_runs_no_further_effect_and_reports_the_claimed(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    charged: list[int] = []
    first_charged = threading.Event()

    def charge_each(ctx: replayq.Context, items: int) -> str:
        for item in range(items):
            # ``ctx.effect`` is a cancel point: after the cancel it raises, never charges.
            ctx.effect("payment.charge", lambda i=item: charged.append(i), key=f"charge:{item}")
            if item == 0:
                first_charged.set()
                deadline = time.monotonic() + 10
                while not ctx.cancelled and time.monotonic() < deadline:
                    time.sleep(0.01)  # the heartbeat brings the cancel
        return "charged all"

    app.job("charge_each", lease="2s", heartbeat="0.1s")(charge_each)
    job_id = app.enqueue("charge_each", {"items": 3})
    with running(app) as worker:
        assert first_charged.wait(10)
        assert app.cancel(job_id)
        wait_for(
            lambda: app.get_job(job_id).state == replayq.JobState.CANCELLED,
            timeout=10,
            what="the job ends cancelled",
        )
    assert charged == [0], "no effect after the cancel"
    assert worker.stats.cancelled == 1 and worker.stats.succeeded == 0
    events = app.trace(job_id)
    (cancelled,) = [e for e in events if e.name == "job.cancelled"]
    assert cancelled.data["claimed_effects"] == [{"key": "charge:0", "status": "succeeded"}]
    claimed = [e.data["key"] for e in events if e.name == "effect.claimed"]
    assert claimed == ["charge:0"], "the later effects were never claimed"


def test_a_running_job_that_fails_after_its_cancel_is_cancelled_not_retried(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    started = threading.Event()

    def flaky(ctx: replayq.Context) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        raise replayq.TransientError("upstream went away")  # retryable, were it not cancelled

    app.job("flaky", lease="2s", heartbeat="0.1s", retry=replayq.Retry(max_attempts=5))(flaky)
    job_id = app.enqueue("flaky")
    with running(app) as worker:
        assert started.wait(10)
        assert app.cancel(job_id)
        wait_for(
            lambda: app.get_job(job_id).state == replayq.JobState.CANCELLED,
            timeout=10,
            what="the job ends cancelled",
        )
    assert worker.stats.cancelled == 1 and worker.stats.retried == 0
    names = [e.name for e in app.trace(job_id)]
    assert "retry.scheduled" not in names and names.count("job.leased") == 1
    (cancelled,) = [e for e in app.trace(job_id) if e.name == "job.cancelled"]
    assert "upstream went away" in cancelled.data["reason"]


def test_a_job_that_reaches_no_boundary_within_its_lease_is_cancelled_not_run_again(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    runs: list[str] = []
    started = threading.Event()

    def stuck(ctx: replayq.Context) -> None:
        runs.append("start")
        started.set()
        time.sleep(2.5)  # past its 1 s lease, with no step boundary or ctx call
        ctx.step("after", lambda: runs.append("after"))

    app.job("stuck", lease="1s", heartbeat="0.2s")(stuck)
    job_id = app.enqueue("stuck")
    with running(app):
        assert started.wait(10)
        assert app.cancel(job_id)
        wait_for(
            lambda: app.get_job(job_id).state == replayq.JobState.CANCELLED,
            timeout=10,
            what="the reaper cancels the job whose lease ran out",
        )
        time.sleep(2.0)  # the stuck handler wakes and tries its next step
    assert runs == ["start"]
    names = [e.name for e in app.trace(job_id)]
    assert names.count("job.leased") == 1  # never handed to a second run
    assert "lease.expired" in names
    (cancelled,) = [e for e in app.trace(job_id) if e.name == "job.cancelled"]
    assert cancelled.data["reason"] == "the lease ran out before a step boundary"
    assert app.get_job(job_id).state == replayq.JobState.CANCELLED


class _HoldAtLockRelease(replayq.Observer):
    """Holds the executor where the handler has returned and its contract lock's release
    has committed (``lock.released``: ``Context.run`` lets go of the lock after the handler
    returned, before the worker reads the cancel flag) until the test lets it go on."""

    def __init__(self) -> None:
        self.returned = threading.Event()
        self.go_on = threading.Event()

    def events(self, events: Sequence[replayq.TraceEvent]) -> None:
        if any(e.name == "lock.released" for e in events) and not self.returned.is_set():
            self.returned.set()
            assert self.go_on.wait(30), "the test never let the executor go on"


def test_a_cancel_that_reaches_the_worker_after_the_handler_returned_leaves_it_succeeded(
    app_factory: Callable[..., replayq.App],
) -> None:
    """The handler did its work (its effect ran) and returned; the cancel request is seen
    by the heartbeat only then, before the worker read the flag. The attempt had
    completed: it is acked (``job.succeeded`` notes ``cancel_too_late``), not cancelled
    with its completed work discarded (before: ``job.cancelled``, its result dropped)."""
    app = app_factory()
    charged: list[str] = []
    kept: list[replayq.Context] = []

    @app.job("charge", lease="2s", heartbeat="0.1s", lock="order:{order}")
    def charge(ctx: replayq.Context, order: str) -> str:
        ctx.effect("payment.charge", lambda: charged.append(order) or "ch_1", key=f"charge:{order}")
        with ctx.step("mark"):
            ctx.state.put("order", order, {"charged": True})
        kept.append(ctx)
        return "charged"

    hold = _HoldAtLockRelease()
    job_id = app.enqueue("charge", {"order": "o1"})
    worker = replayq.Worker(app, poll_interval=0.02, grace_period=5, observers=[hold])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert hold.returned.wait(10), "the handler never returned"
        assert app.cancel(job_id)
        [ctx] = kept
        # The heartbeat brings the request to the attempt: its flag is set, before the
        # worker (held here) reads it.
        wait_for(lambda: ctx.cancelled, timeout=10, what="the heartbeat sees the cancel")
        hold.go_on.set()
        wait_for(
            lambda: (
                app.get_job(job_id).state
                in (replayq.JobState.SUCCEEDED, replayq.JobState.CANCELLED)
            ),
            timeout=10,
            what="the job settles",
        )
    finally:
        hold.go_on.set()
        worker.stop()
        thread.join(10)
    job = app.get_job(job_id)
    assert job.state == replayq.JobState.SUCCEEDED, "the completed attempt stands"
    assert charged == ["o1"]
    assert worker.stats.succeeded == 1 and worker.stats.cancelled == 0
    events = app.trace(job_id)
    assert "job.cancelled" not in [e.name for e in events]
    (succeeded,) = [e for e in events if e.name == "job.succeeded"]
    assert succeeded.data["cancel_too_late"] is True
    assert app.state.get("order", "o1").data == {"charged": True}
    [record] = app.effects()
    assert record.status == "succeeded"


def test_a_handler_that_saw_the_cancel_and_returned_ends_cancelled(
    app_factory: Callable[..., replayq.App],
) -> None:
    """The rule's other side: a cancel the handler could see (``ctx.cancelled`` was set
    before it returned) ends the attempt cancelled, its writes outside steps dropped."""
    app = app_factory()
    started = threading.Event()

    @app.job("polls", lease="2s", heartbeat="0.1s")
    def polls(ctx: replayq.Context) -> str:
        started.set()
        deadline = time.monotonic() + 10
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)  # a long loop without cancel points
        ctx.state.put("order", "o1", {"half": True})  # outside a step: dropped
        return "stopped early"

    job_id = app.enqueue("polls")
    with running(app) as worker:
        assert started.wait(10)
        assert app.cancel(job_id)
        wait_for(
            lambda: app.get_job(job_id).state == replayq.JobState.CANCELLED,
            timeout=10,
            what="the job ends cancelled",
        )
    assert worker.stats.cancelled == 1 and worker.stats.succeeded == 0
    (cancelled,) = [e for e in app.trace(job_id) if e.name == "job.cancelled"]
    assert cancelled.data["reason"] == "the handler returned after the cancel"
    assert not app.state.get("order", "o1").exists
