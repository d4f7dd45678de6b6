"""A worker does not start a held job whose lease it lost while it waited.

Worker A leases a batch; before its executor takes the jobs up, their leases run out
(the worker stalled: SIGSTOP, a paused VM, a long pause). Either B reaped them and runs
them (worst moment: B's handler is inside the first job, at a barrier, when A's
executor comes to it), or nobody did. A's executor then renews the batch's leases in
one statement and starts only the jobs still held: a reaped job's handler never runs in
A (its body is where a ``ctx.call`` or code that bypasses ``ctx`` would act twice), A
writes nothing for it but the heartbeat's ``lease.lost`` (``started: false``), and the
job succeeds once, B's. Unreaped, the lease is renewed and A runs the jobs as if it had
not stalled.

Each case runs under both judges of a lease: the app's frozen clock (moved by the test)
and the database's clock (real time, A's bound being its monotonic clock; the test
sleeps past the lease). ``tests/acceptance/test_stalled_prefetch.py`` does the same
with real worker processes and SIGSTOP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

import replayq
from replayq.worker.core import STOP

AppFactory = Callable[..., replayq.App]
LEASE = 1.0
JOBS = 3


@dataclass
class Held:
    """Worker A holding ``JOBS`` leased jobs it has not started; who entered which handler."""

    app: replayq.App
    a: replayq.Worker
    jobs: list[replayq.Job]
    move_clock: Callable[[float], None]
    entered: list[tuple[str, int]] = field(default_factory=list)
    b_inside: threading.Event = field(default_factory=threading.Event)
    b_may_finish: threading.Event = field(default_factory=threading.Event)

    def entries(self, worker_id: str) -> list[int]:
        return [n for who, n in self.entered if who == worker_id]

    def past_the_lease(self) -> None:
        """Time passes beyond A's leases, with no heartbeat of A's (A is stalled)."""
        self.move_clock(LEASE + 0.3)

    def run_a(self) -> None:
        """A's executor takes up what it holds, as when the stalled worker resumes."""
        self.a._hand_out([STOP])
        self.a._executor()

    def trace_names(self, job: replayq.Job, worker_id: str) -> list[str]:
        return [e.name for e in self.app.trace(job.id) if e.worker_id == worker_id]


@pytest.fixture(params=["frozen", "database"])
def held(request: pytest.FixtureRequest, app_factory: AppFactory) -> Held:
    """``frozen``: the app's ``FrozenClock`` judges leases, the test moves it. ``database``:
    the real clock, so the database judges them; the test sleeps past the lease."""
    move_clock: Callable[[float], None]
    if request.param == "frozen":
        clock = replayq.FrozenClock()
        app = app_factory(clock=clock)
        move_clock = clock.advance
    else:
        app = app_factory()
        assert app.runtime.leases_by_database
        move_clock = time.sleep
    return hold_batch(app, move_clock)


def hold_batch(app: replayq.App, move_clock: Callable[[float], None]) -> Held:
    """A holding ``JOBS`` jobs of a handler that notes who entered it, none started."""
    holder: list[Held] = []

    @app.job("enter", lease=f"{LEASE}s", heartbeat="0.3s")
    def enter(ctx: replayq.Context, n: int) -> dict[str, str]:
        h = holder[0]
        # Outside ``ctx``: what a handler does that no fencing can take back.
        h.entered.append((ctx.worker_id, n))
        if ctx.worker_id == "b" and n == 0:
            h.b_inside.set()
            assert h.b_may_finish.wait(30), "the test never let B finish"
        return {"by": ctx.worker_id}

    for n in range(JOBS):
        app.enqueue("enter", {"n": n})
    a = replayq.Worker(app, worker_id="a", concurrency=1, prefetch=JOBS)
    jobs = a.lease(JOBS, ahead=JOBS - 1)
    assert [j.payload["n"] for j in jobs] == list(range(JOBS))
    h = Held(app, a, jobs, move_clock)
    holder.append(h)
    return h


@contextmanager
def b_inside_the_first(h: Held) -> Iterator[replayq.Worker]:
    """B reaped A's jobs and leased them; its handler is inside the first one."""
    b = replayq.Worker(h.app, worker_id="b")
    assert b.reap() == JOBS
    owned = b.lease(JOBS)
    assert sorted(j.id for j in owned) == sorted(j.id for j in h.jobs)
    runner = threading.Thread(target=b.execute, args=(owned[0],), name="worker-b")
    runner.start()
    try:
        assert h.b_inside.wait(30)
        yield b
    finally:
        h.b_may_finish.set()
        runner.join(30)
    for job in owned[1:]:
        b.execute(job)


def test_jobs_held_ahead_and_reaped_while_the_worker_stalled_are_not_run_again(
    held: Held,
) -> None:
    held.past_the_lease()
    with b_inside_the_first(held):
        held.run_a()  # A resumes while B runs the first job
        assert held.entries("a") == [], "A ran the handler of a job it no longer held"
        assert held.a.stats.lost == JOBS
        assert not held.a._inflight, "A still holds jobs it lost"
    assert sorted(held.entries("b")) == list(range(JOBS))
    for job in held.jobs:
        done = held.app.get_job(job.id)
        assert done.state is replayq.JobState.SUCCEEDED and done.result == {"by": "b"}
        events = held.app.trace(job.id)
        assert [e.name for e in events].count("job.succeeded") == 1
        # A's only word about the job: its lease is lost, and the job was never started.
        lost = [e for e in events if e.worker_id == "a" and e.name == "lease.lost"]
        assert [e.data.get("started") for e in lost] == [False]
        assert held.trace_names(job, "a") == ["job.leased", "lease.lost"]


def test_jobs_held_past_their_lease_but_not_reaped_are_renewed_and_run_once(
    held: Held,
) -> None:
    held.past_the_lease()
    held.run_a()
    assert held.entries("a") == list(range(JOBS))
    assert held.a.stats.lost == 0
    for job in held.jobs:
        done = held.app.get_job(job.id)
        assert done.state is replayq.JobState.SUCCEEDED and done.result == {"by": "a"}
        assert (done.attempt, done.redelivery_count) == (1, 0)
        names = held.trace_names(job, "a")
        # Renewed before it started: one statement for the batch, the first job's start.
        assert names[:2] == ["job.leased", "lease.extended"], names
        assert "lease.lost" not in names and "job.write_rejected" not in names


def test_a_fixed_visibility_timeout_job_past_its_window_is_not_started(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    ran: list[int] = []
    app.job("fixed", lease="1s", heartbeat=0)(lambda ctx, n: ran.append(n))
    job_id = app.enqueue("fixed", {"n": 1})
    a = replayq.Worker(app, worker_id="a")
    a.lease(1)
    clock.advance(1.5)  # its window ended before an executor took it: never renewed
    a._hand_out([STOP])
    a._executor()
    assert ran == []
    assert a.stats.lost == 1
    # Nothing written for it: the reaper re-delivers it, as after any window.
    assert app.get_job(job_id).state is replayq.JobState.RUNNING
    b = replayq.Worker(app, worker_id="b")
    assert b.reap() == 1
    [again] = b.lease(1)
    b.execute(again)
    assert ran == [1]
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED


def test_a_job_whose_lease_the_heartbeat_found_lost_is_not_started_before_its_bound(
    app_factory: AppFactory,
) -> None:
    """The lease taken while A's own bound has not passed (the database's clock stepped
    ahead of A's, an operator's release): the heartbeat's word is enough."""
    clock = replayq.FrozenClock()
    held = hold_batch(app_factory(clock=clock), clock.advance)
    leased_at = clock.now()
    held.past_the_lease()
    with b_inside_the_first(held):
        flights = [held.a._inflight[job.id] for job in held.jobs]
        held.a.extend_leases(flights)  # A's heartbeat: every lease lost
        clock.set(leased_at)  # A's bound not passed
        held.run_a()
        assert held.entries("a") == [], "A started a job its heartbeat had found lost"
    assert held.a.stats.lost == JOBS
    for job in held.jobs:
        assert held.trace_names(job, "a") == ["job.leased", "lease.lost"]


def test_a_job_asked_to_stop_while_it_waited_past_its_lease_is_not_started(
    held: Held,
) -> None:
    """Asked to stop while A stalled: the renewal before its start does not extend a lease
    whose job was asked to stop, so the lease is still past A's bound and the handler must
    not run on it (the reaper cancels the job, as any stopped job that outlived its
    lease)."""
    for job in held.jobs:
        assert held.app.cancel(job.id)
    held.past_the_lease()
    held.run_a()
    assert held.entries("a") == [], "A ran the handler of a job whose lease it did not renew"
    assert not held.a._inflight
    b = replayq.Worker(held.app, worker_id="b")
    assert b.reap() == JOBS
    for job in held.jobs:
        assert held.app.get_job(job.id).state is replayq.JobState.CANCELLED


def test_a_lease_found_lost_is_not_beaten_again(app_factory: AppFactory) -> None:
    """A lost lease stays lost (its owner token is the lease's own): the next beats leave
    it alone, so its trace says ``lease.lost`` once, not once a beat while the job waits
    for an executor (or its handler runs on), and the heartbeat does not wake for it."""
    clock = replayq.FrozenClock()
    held = hold_batch(app_factory(clock=clock), clock.advance)
    held.past_the_lease()
    with b_inside_the_first(held):
        flights = [held.a._inflight[job.id] for job in held.jobs]
        held.a.extend_leases(flights)  # A's heartbeat: every lease lost
        held.a.extend_leases(flights)  # and its next beat
        assert all(f.next_heartbeat == float("inf") for f in flights)
        held.run_a()
    for job in held.jobs:
        assert held.trace_names(job, "a") == ["job.leased", "lease.lost"]
