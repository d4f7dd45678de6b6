"""Errors that are not the database's, in a worker's start of a job and in its dispatcher.

A job whose start raises an unexpected error leaves the worker cleanly: given back to
the queue unstarted, forgotten, told to the observers (``released``, reason ``error``), the
error logged with its traceback.

Before, an error other than a ``ReplayqError`` out of ``Executing._start`` left the job held:
never run, never given back, its lease extended by every heartbeat for as long as the
worker lived, its slot taken, the observers told nothing (a burst run never ended).

A dispatcher that dies stops the worker as a stop does: its jobs held ahead are given back
unstarted and told to the observers as ``released`` (``stopped``). Before, nothing was
given back unstarted and the observers heard nothing of them.

Each fault is the app's own: its clock (``App(clock=...)``; a frozen one judges leases)
fails once, on the executor's first reading (the start's look at the lease it holds), or
on the dispatcher's thread. A real worker ``run()`` on real databases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import replayq
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]


class FailingOnceOnAnExecutor(replayq.FrozenClock):
    """A frozen clock whose first reading on an executor thread fails (a clock source erring)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = threading.Event()

    def now(self) -> float:
        if threading.current_thread().name.startswith("replayq-exec-") and not self.failed.is_set():
            self.failed.set()
            raise OSError("the clock source is unavailable")
        return super().now()


def test_a_job_whose_start_raises_is_given_back_unstarted(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FailingOnceOnAnExecutor()
    app = app_factory(clock=clock)
    ran: list[int] = []

    @app.job("ok", lease="30s", heartbeat="0.1s")
    def ok(ctx: replayq.Context, n: int) -> int:
        ran.append(n)
        return n

    job_id = app.enqueue("ok", {"n": 1})
    ledger = Ledger()
    worker = replayq.Worker(app, worker_id="w", burst=True, poll_interval=0.05, observers=[ledger])
    caplog.set_level(logging.ERROR, logger="replayq.worker")
    runner = threading.Thread(target=worker.run, name="burst")
    runner.start()
    runner.join(10)
    stuck = runner.is_alive()
    if stuck:
        worker.stop()
        worker.stop()  # forced: no grace
        runner.join(30)
    assert clock.failed.is_set(), "the fault never happened"
    assert not stuck, "the burst run never ended: the job stayed held"

    # Given back unstarted, then leased again and run once.
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED and ran == [1]
    assert job.attempt == 1, "the start that failed counted an attempt"
    names = [e.name for e in app.trace(job_id)]
    assert names == ["job.enqueued", "job.leased", "lease.released", "job.leased", "job.succeeded"]
    (released,) = [e for e in app.trace(job_id) if e.name == "lease.released"]
    assert released.worker_id == "w" and released.data["started"] is False
    assert "OSError" in released.data["reason"]
    assert not [e for e in app.trace(job_id) if e.name in ("lease.extended", "lease.lost")]

    # The observers heard it left unrun, then its one attempt settle.
    assert ledger.released_ids == {job_id: ["error"]}
    assert ledger.attempts == ledger.settled_ids == Counter([job_id])
    assert worker.stats.released == 1 and worker.stats.leased == 2
    assert not worker._inflight

    # The error is logged with its traceback.
    logged = [r for r in caplog.records if r.exc_info and f"job {job_id}" in r.getMessage()]
    assert logged, [r.getMessage() for r in caplog.records]
    assert isinstance(logged[0].exc_info[1], OSError)  # type: ignore[index]
    assert "not started" in logged[0].getMessage()


@dataclass
class HeldRun:
    """A worker (one executor, three jobs held ahead) whose run is ``run``: its first job
    blocks until ``finish`` (``entered`` once it runs); what ``run()`` raised is kept."""

    entered: threading.Event
    finish: threading.Event
    first: int
    held: list[int]
    ledger: Ledger
    worker: replayq.Worker
    raised: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.raised.append(exc)


def _one_running_three_held(
    app_factory: AppFactory, clock: replayq.Clock
) -> tuple[replayq.App, HeldRun]:
    app = app_factory(clock=clock)
    entered, finish = threading.Event(), threading.Event()

    @app.job("block", lease="30s", heartbeat="10s")
    def block(ctx: replayq.Context) -> None:
        entered.set()
        assert finish.wait(30), "the test never let the blocking job finish"

    @app.job("ok", lease="30s", heartbeat="10s")
    def ok(ctx: replayq.Context, n: int) -> int:
        return n

    first = app.enqueue("block", {})
    held = [app.enqueue("ok", {"n": n}) for n in range(3)]
    ledger = Ledger()
    worker = replayq.Worker(
        app,
        worker_id="w",
        concurrency=1,
        prefetch=3,
        prefetch_window=float("inf"),
        poll_interval=0.05,
        grace_period=20,
        observers=[ledger],
    )
    return app, HeldRun(entered, finish, first, held, ledger, worker)


class FailingOnceOnThread(replayq.FrozenClock):
    """A frozen clock whose next reading on the thread named ``thread`` fails, once armed."""

    def __init__(self, thread: str) -> None:
        super().__init__()
        self.thread = thread
        self.armed = threading.Event()
        self.failed = threading.Event()

    def now(self) -> float:
        if self.armed.is_set() and threading.current_thread().name == self.thread:
            self.armed.clear()
            self.failed.set()
            raise RuntimeError("the clock source failed")
        return super().now()


def test_a_dispatcher_that_dies_gives_back_the_held_jobs_to_the_observers_too(
    app_factory: AppFactory,
) -> None:
    """The dispatcher runs on the thread that called ``run()``; its clock fails while the
    worker runs one job and holds three ahead: those three are given back unstarted and
    told to the observers as ``released`` (``stopped``), the running one finishes in the
    grace, and ``run()`` raises the error. (``tests/acceptance/
    test_shutdown_dispatcher_fault.py`` does it to a real worker process.)"""
    clock = FailingOnceOnThread("runner")
    app, held_run = _one_running_three_held(app_factory, clock)
    entered, finish, first, held = held_run.entered, held_run.finish, held_run.first, held_run.held
    ledger, worker, raised, run = held_run.ledger, held_run.worker, held_run.raised, held_run.run

    runner = threading.Thread(target=run, name="runner")
    runner.start()
    try:
        assert entered.wait(30), "the worker never started the blocking job"
        deadline = threading.Event()
        for _ in range(200):
            with worker._inflight_lock:
                if len(worker._inflight) == 4:
                    break
            deadline.wait(0.05)
        assert len(worker._inflight) == 4, "the premise: one job running, three held ahead"
        clock.armed.set()
        for _ in range(200):
            with ledger.lock:
                if len(ledger.released_ids) == 3:
                    break
            deadline.wait(0.05)
        assert clock.failed.is_set(), "the fault never happened"
        assert ledger.released_ids == {job_id: ["stopped"] for job_id in held}
    finally:
        finish.set()
        runner.join(30)
    assert not runner.is_alive()
    assert [type(exc) for exc in raised] == [RuntimeError]
    assert ledger.settled_ids == Counter([first])
    assert app.get_job(first).state is replayq.JobState.SUCCEEDED
    for job_id in held:
        job = app.get_job(job_id)
        assert (job.state, job.attempt) == (replayq.JobState.QUEUED, 0)
    assert not worker._inflight


class FailingForGoodOnThread(replayq.FrozenClock):
    """A frozen clock whose every reading on the thread named ``thread`` fails once armed
    (a clock source gone for good, not a glitch)."""

    def __init__(self, thread: str) -> None:
        super().__init__()
        self.thread = thread
        self.armed = threading.Event()
        self.failed = threading.Event()

    def now(self) -> float:
        if self.armed.is_set() and threading.current_thread().name == self.thread:
            self.failed.set()
            raise RuntimeError("the clock source is gone")
        return super().now()


def test_a_dispatcher_that_dies_for_good_still_ends_its_run(app_factory: AppFactory) -> None:
    """The dispatcher's clock fails on every reading from some point on: its stop gives
    the held jobs back in a transaction that reads the clock too, and fails. The run still
    winds down (its executors, heartbeat and acks threads end; the observers hear of the
    held jobs), the held jobs are left to be reaped after their lease, and ``run()`` raises
    the dispatcher's error. Before, the give-back's error went up out of the shutdown: no
    executor was told to stop, the acks thread never ended, the observers heard nothing of
    the held jobs, and ``run()`` raised the give-back's error instead."""
    clock = FailingForGoodOnThread("runner")
    app, held_run = _one_running_three_held(app_factory, clock)
    entered, finish, first, held = held_run.entered, held_run.finish, held_run.first, held_run.held
    ledger, worker, raised, run = held_run.ledger, held_run.worker, held_run.raised, held_run.run

    before = set(threading.enumerate())
    runner = threading.Thread(target=run, name="runner")
    runner.start()
    pause = threading.Event()
    try:
        assert entered.wait(30), "the worker never started the blocking job"
        for _ in range(200):
            with worker._inflight_lock:
                if len(worker._inflight) == 4:
                    break
            pause.wait(0.05)
        assert len(worker._inflight) == 4, "the premise: one job running, three held ahead"
        clock.armed.set()
        assert clock.failed.wait(10), "the fault never happened"
        for _ in range(100):  # the held jobs' give-back (told to the observers, or raised)
            with ledger.lock:
                if len(ledger.released_ids) == 3 or raised:
                    break
            pause.wait(0.05)
    finally:
        finish.set()
        runner.join(30)
    assert not runner.is_alive()
    assert [str(exc) for exc in raised] == ["the clock source is gone"], raised
    assert ledger.released_ids == {job_id: ["stopped"] for job_id in held}
    assert ledger.settled_ids == Counter([first])
    assert app.get_job(first).state is replayq.JobState.SUCCEEDED
    for job_id in held:  # not given back (the clock): left to be reaped after their lease
        assert app.get_job(job_id).state is replayq.JobState.RUNNING

    def left() -> list[str]:
        threads = set(threading.enumerate()) - before
        return [
            t.name
            for t in threads
            if t.name.startswith(("replayq-exec", "replayq-h", "replayq-acks"))
        ]

    for _ in range(100):
        if not left():
            break
        pause.wait(0.05)
    assert not left(), "the run's threads did not end"
    assert not worker._inflight


class FailingOnceOnTheHeartbeat(replayq.SystemClock):
    """The system clock, whose first reading on the heartbeat's thread fails."""

    def __init__(self) -> None:
        self.failed = threading.Event()

    def now(self) -> float:
        if threading.current_thread().name == "replayq-heartbeat" and not self.failed.is_set():
            self.failed.set()
            raise OSError("the clock source is unavailable")
        return super().now()


def test_a_heartbeat_that_fails_once_goes_on_beating(app_factory: AppFactory) -> None:
    """An error of the heartbeat that is not the database's (the app's clock failing) is
    logged and the beat tried again: before, it ended the heartbeat's thread, and every
    lease the worker held ran out under its running handlers."""
    clock = FailingOnceOnTheHeartbeat()
    app = app_factory(clock=clock)
    running, finish = threading.Event(), threading.Event()

    @app.job("long", lease="1s", heartbeat="0.2s")
    def long(ctx: replayq.Context) -> None:
        running.set()
        assert finish.wait(30)

    job_id = app.enqueue("long", {})
    worker = replayq.Worker(app, worker_id="w", burst=True)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        assert running.wait(10)
        assert clock.failed.wait(5), "the heartbeat never read the clock"
        first = app.get_job(job_id).lease_deadline
        assert first is not None
        time.sleep(1.0)  # five beats' worth
        later = app.get_job(job_id).lease_deadline
        assert later is not None and later > first + 0.5, (first, later)
    finally:
        finish.set()
        runner.join(30)
    assert app.get_job(job_id).state == "succeeded"
