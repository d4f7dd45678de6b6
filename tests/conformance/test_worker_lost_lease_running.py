"""A running handler whose lease the heartbeat found lost makes no further call.

Worker A's handler makes one call and pauses between calls (the worker stalled: a long
GC, a paused VM). Its lease runs out; worker B reaps the job, leases it and runs it
(worst moment: B's handler is inside, at a barrier). Then A's heartbeat beats and finds
the lease lost, and A's handler goes on to its next ``ctx.call``. That call is not made:
the function is never called (counted outside ``ctx``, where a second real call would do
harm no fencing takes back), ``LeaseLostError`` is raised in the handler, and
``ctx.cancelled`` and ``ctx.lease_lost`` both read True. A records the attempt as a
refused settle (``job.write_rejected``), schedules no retry and writes nothing of the
job's; B's run is unaffected and the job succeeds once, B's. A goes on with other jobs.

Sync and ``async def`` handlers, on both backends. A handler that polls ``ctx.cancelled``
in a loop stops once a running worker's own heartbeat thread finds the lease lost.
``tests/acceptance/test_stalled_worker.py`` does the same with real worker processes and
SIGSTOP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

import replayq
from tests.acceptance.workers import wait_for

AppFactory = Callable[..., replayq.App]


@dataclass
class Race:
    """Who made which call for real, and what A's handler saw after its lease was lost."""

    made: list[tuple[str, str]] = field(default_factory=list)
    a_between_calls: threading.Event = field(default_factory=threading.Event)
    a_may_go_on: threading.Event = field(default_factory=threading.Event)
    b_inside: threading.Event = field(default_factory=threading.Event)
    b_may_finish: threading.Event = field(default_factory=threading.Event)
    seen_by_a: dict[str, Any] = field(default_factory=dict)

    def calls_of(self, worker_id: str) -> list[str]:
        return [name for who, name in self.made if who == worker_id]

    def outside(self, who: str, name: str) -> str:
        """The external call: what it does happens whether or not anything commits."""
        self.made.append((who, name))
        return name

    async def outside_async(self, who: str, name: str) -> str:
        return self.outside(who, name)

    def pause(self, ctx: replayq.Context) -> None:
        """A stalls between its calls; B waits at its barrier inside the job."""
        if ctx.worker_id == "a":
            self.a_between_calls.set()
            assert self.a_may_go_on.wait(30), "the test never let A go on"
            self.seen_by_a.update(cancelled=ctx.cancelled, lease_lost=ctx.lease_lost)
        else:
            self.b_inside.set()
            assert self.b_may_finish.wait(30), "the test never let B finish"

    def stopped(self, ctx: replayq.Context, exc: BaseException) -> None:
        if ctx.worker_id == "a":
            self.seen_by_a["error"] = exc


def sync_handler(race: Race) -> Callable[..., dict[str, str]]:
    def fetch(ctx: replayq.Context, n: int) -> dict[str, str]:
        ctx.call("first", race.outside, ctx.worker_id, "first")
        race.pause(ctx)
        try:
            ctx.call("second", race.outside, ctx.worker_id, "second")
        except BaseException as exc:
            race.stopped(ctx, exc)
            raise
        return {"by": ctx.worker_id}

    return fetch


def async_handler(race: Race) -> Callable[..., Coroutine[Any, Any, dict[str, str]]]:
    async def fetch(ctx: replayq.Context, n: int) -> dict[str, str]:
        await ctx.call("first", race.outside_async, ctx.worker_id, "first")
        race.pause(ctx)  # blocks this worker's loop: nothing else runs on it here
        try:
            await ctx.call("second", race.outside_async, ctx.worker_id, "second")
        except BaseException as exc:
            race.stopped(ctx, exc)
            raise
        return {"by": ctx.worker_id}

    return fetch


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_whose_lease_the_heartbeat_found_lost_makes_no_further_call(
    app_factory: AppFactory, kind: str
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    race = Race()
    handler = sync_handler(race) if kind == "sync" else async_handler(race)
    retry = replayq.Retry(max_attempts=3, base="1s", cap="1s")
    app.job("fetch", lease="1s", heartbeat="0.3s", retry=retry)(handler)
    app.job("next")(lambda ctx: ctx.call("next", race.outside, ctx.worker_id, "next"))
    job_id = app.enqueue("fetch", {"n": 1})

    a = replayq.Worker(app, worker_id="a")
    b = replayq.Worker(app, worker_id="b")
    [stale] = a.lease(1)
    run_a = threading.Thread(target=a.execute, args=(stale,), name="worker-a")
    run_b: threading.Thread | None = None
    run_a.start()
    try:
        assert race.a_between_calls.wait(30), "A's handler never made its first call"
        clock.advance(2)  # A's lease runs out while it stalls; A does not know yet
        assert b.reap() == 1
        [owned] = b.lease(1)
        assert owned.id == stale.id == job_id and owned.owner_token != stale.owner_token
        run_b = threading.Thread(target=b.execute, args=(owned,), name="worker-b")
        run_b.start()
        assert race.b_inside.wait(30), "B's handler never started"

        a.extend_leases([a._inflight[stale.id]])  # A's heartbeat: the lease is lost
        race.a_may_go_on.set()
        run_a.join(30)
        assert not run_a.is_alive()

        # A's next call was not made: it stopped there, told why.
        assert race.calls_of("a") == ["first"], "A called out after its lease was lost"
        assert isinstance(race.seen_by_a.get("error"), replayq.LeaseLostError)
        assert race.seen_by_a["cancelled"] and race.seen_by_a["lease_lost"]
        # Nothing of A's changed the job B is running; A scheduled no retry.
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.RUNNING and job.worker_id == "b"
        assert job.owner_token == owned.owner_token
        assert job.lease_deadline == owned.lease_deadline, "B's lease was changed"
        assert (job.attempt, job.last_error) == (owned.attempt, None)
        by_a = [e.name for e in app.trace(job_id) if e.worker_id == "a"]
        assert by_a.count("job.write_rejected") == 1, by_a
        assert not {"retry.scheduled", "job.failed", "job.dead"} & set(by_a), by_a
        assert (a.stats.rejected, a.stats.retried, a.stats.dead) == (1, 0, 0)
    finally:
        race.a_may_go_on.set()
        race.b_may_finish.set()
        run_a.join(30)
        if run_b is not None:
            run_b.join(30)
    # B's run went on unaffected: both its calls made, the job succeeded once, B's.
    assert run_b is not None and not run_b.is_alive()
    assert race.calls_of("b") == ["first", "second"]
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED and job.result == {"by": "b"}
    names = [e.name for e in app.trace(job_id)]
    assert names.count("job.succeeded") == 1 and "retry.scheduled" not in names

    # A goes on with other jobs.
    next_id = app.enqueue("next", {})
    [later] = a.lease(1)
    assert later.id == next_id
    a.execute(later)
    assert app.get_job(next_id).state is replayq.JobState.SUCCEEDED
    assert race.calls_of("a") == ["first", "next"]
    a.event_loop.close()
    b.event_loop.close()


def test_a_handler_polling_ctx_cancelled_stops_once_the_heartbeat_thread_finds_the_lease_lost(
    app_factory: AppFactory,
) -> None:
    """A running worker's own heartbeat thread, held off while the job is taken over (as a
    stall would), then let go: the handler's loop on ``ctx.cancelled`` ends, its return is
    recorded as a refused settle, and the worker runs its next job."""
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    race = Race()

    def poll(ctx: replayq.Context, n: int) -> dict[str, str]:
        if ctx.worker_id == "a":
            race.a_between_calls.set()
            deadline = time.monotonic() + 20
            while not ctx.cancelled and time.monotonic() < deadline:
                time.sleep(0.01)  # work between cancel points
            race.seen_by_a.update(cancelled=ctx.cancelled, lease_lost=ctx.lease_lost)
        else:
            race.pause(ctx)
        return {"by": ctx.worker_id}

    app.job("poll", lease="1s", heartbeat="0.1s")(poll)
    app.job("next")(lambda ctx: ctx.call("next", race.outside, ctx.worker_id, "next"))
    job_id = app.enqueue("poll", {"n": 1})
    # No reaper of its own (B reaps), one slot, nothing leased ahead.
    a = replayq.Worker(
        app, worker_id="a", poll_interval=0.02, reap_interval=3600, prefetch=0, grace_period=5
    )
    b = replayq.Worker(app, worker_id="b")
    run_a = threading.Thread(target=a.run, name="worker-a", daemon=True)
    run_b: threading.Thread | None = None
    run_a.start()
    try:
        assert race.a_between_calls.wait(30), "A never started the job"
        flight = a._inflight[job_id]
        with flight.beat:  # A's heartbeat skips this lease: A stalls, as far as it knows
            clock.advance(2)
            assert b.reap() == 1
            [owned] = b.lease(1)
            run_b = threading.Thread(target=b.execute, args=(owned,), name="worker-b")
            run_b.start()
            assert race.b_inside.wait(30), "B's handler never started"
        # A's heartbeat thread beats again: the lease is lost, ``ctx.cancelled`` reads True.
        wait_for(
            lambda: [e for e in app.trace(job_id) if e.name == "job.write_rejected"],
            timeout=10,
            what="A's handler to stop polling and its return to be refused",
        )
        assert race.seen_by_a == {"cancelled": True, "lease_lost": True}
        [rejected] = [e for e in app.trace(job_id) if e.name == "job.write_rejected"]
        assert (rejected.worker_id, rejected.data["attempted"]) == ("a", "job.succeeded")
        job = app.get_job(job_id)
        assert (job.state, job.worker_id, job.owner_token) == (
            replayq.JobState.RUNNING,
            "b",
            owned.owner_token,
        )
        # A goes on with other jobs.
        next_id = app.enqueue("next", {})
        wait_for(
            lambda: app.get_job(next_id).state is replayq.JobState.SUCCEEDED,
            timeout=10,
            what="A to run its next job",
        )
        assert race.calls_of("a") == ["next"]
    finally:
        race.b_may_finish.set()
        if run_b is not None:
            run_b.join(30)
        a.stop()
        run_a.join(30)
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED and job.result == {"by": "b"}
    names = [e.name for e in app.trace(job_id)]
    assert names.count("job.succeeded") == 1 and "retry.scheduled" not in names
    assert (a.stats.rejected, a.stats.succeeded, a.stats.retried) == (1, 1, 0)
