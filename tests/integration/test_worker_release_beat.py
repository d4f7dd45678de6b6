"""A held job the worker gives back unstarted is never beaten after it is given back.

The heartbeat extends every lease held in one statement, each under its flight's
``beat``. A held job given back unstarted (the worker stops: ``_release_unstarted``; its
start raised: ``_unstartable``) was released without that lock: a beat already under way
(its list of leases read before the job was forgotten) then ran its compare-and-set after
the release had committed, found the lease gone and traced ``lease.lost``
(``started: false``) for a job given back cleanly, counted in
``replayq_leases_lost_total`` (and, had it come before the observers were told, told them
``lost`` instead of ``stopped``/``error``). On a busy worker with short heartbeats every
graceful stop could do it.

The beat under way is made deterministic with the app's own clock: once armed, the
heartbeat thread's next reading of it (the first thing a beat does, its flights' ``beat``
locks held) waits until the test lets it go. Real worker ``run()``, real databases.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import replayq

AppFactory = Callable[..., replayq.App]


class BeatHeld(replayq.FrozenClock):
    """A frozen clock whose next reading on the heartbeat thread waits, once armed, until
    ``go``; and whose next reading on an executor fails, once ``fail_start`` is armed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()
        self.waiting = threading.Event()
        self.go = threading.Event()
        self.fail_start = threading.Event()
        self.failed = threading.Event()

    def now(self) -> float:
        name = threading.current_thread().name
        if name == "replayq-heartbeat" and self.armed.is_set():
            self.armed.clear()
            self.waiting.set()
            self.go.wait(30)
        if name.startswith("replayq-exec-") and self.fail_start.is_set():
            self.fail_start.clear()
            self.failed.set()
            raise OSError("the clock source is unavailable")
        return super().now()


class Ledger(replayq.Observer):
    def __init__(self) -> None:
        self.released_ids: dict[int, list[str]] = {}
        self.lock = threading.Lock()
        self.told = threading.Event()

    def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
        return nullcontext()

    def released(self, job: replayq.Job, reason: replayq.ReleaseReason) -> None:
        with self.lock:
            self.released_ids.setdefault(job.id, []).append(str(reason))
        self.told.set()


def _wait_held(worker: replayq.Worker, count: int) -> None:
    pause = threading.Event()
    for _ in range(200):
        with worker._inflight_lock:
            if len(worker._inflight) == count:
                return
        pause.wait(0.05)
    raise AssertionError(f"the premise: {count} jobs held, not {len(worker._inflight)}")


def _setup(app_factory: AppFactory, held: int) -> tuple[replayq.App, BeatHeld, threading.Event]:
    clock = BeatHeld()
    app = app_factory(clock=clock)
    entered, finish = threading.Event(), threading.Event()

    @app.job("block", lease="30s", heartbeat="0.1s")
    def block(ctx: replayq.Context) -> None:
        entered.set()
        assert finish.wait(30), "the test never let the blocking job finish"

    @app.job("ok", lease="30s", heartbeat="0.1s")
    def ok(ctx: replayq.Context, n: int) -> int:
        return n

    app.enqueue("block", {})
    for n in range(held):
        app.enqueue("ok", {"n": n})
    return app, clock, finish


def _start(app: replayq.App, ledger: Ledger, held: int) -> tuple[replayq.Worker, threading.Thread]:
    worker = replayq.Worker(
        app,
        worker_id="w",
        concurrency=1,
        prefetch=held,
        prefetch_window=float("inf"),
        poll_interval=0.05,
        grace_period=20,
        observers=[ledger],
    )
    runner = threading.Thread(target=worker.run, name="runner")
    runner.start()
    _wait_held(worker, 1 + held)
    return worker, runner


def _lost(app: replayq.App, job_ids: list[int]) -> dict[int, list[str]]:
    names = {job_id: [e.name for e in app.trace(job_id)] for job_id in job_ids}
    return {job_id: n for job_id, n in names.items() if "lease.lost" in n}


def test_jobs_given_back_at_a_stop_are_not_beaten_after(app_factory: AppFactory) -> None:
    app, clock, finish = _setup(app_factory, held=4)
    ledger = Ledger()
    worker, runner = _start(app, ledger, held=4)
    held = [job_id for job_id in worker._inflight if job_id != 1]
    try:
        clock.armed.set()
        assert clock.waiting.wait(10), "the heartbeat never beat"
        worker.stop()  # the held jobs go back unstarted while that beat is under way
        ledger.told.wait(2)  # (with the fix, the release waits for the beat instead)
        clock.go.set()
        for _ in range(100):
            with ledger.lock:
                if len(ledger.released_ids) == len(held):
                    break
            threading.Event().wait(0.05)
    finally:
        clock.go.set()
        finish.set()
        runner.join(30)
    assert not runner.is_alive()
    assert ledger.released_ids == {job_id: ["stopped"] for job_id in held}
    for job_id in held:
        job = app.get_job(job_id)
        assert (job.state, job.attempt) == (replayq.JobState.QUEUED, 0)
    assert _lost(app, held) == {}, "a job given back cleanly was traced as its lease lost"
    assert worker.stats.lost == 0


def test_a_job_whose_start_raised_is_not_beaten_after_it_is_given_back(
    app_factory: AppFactory,
) -> None:
    app, clock, finish = _setup(app_factory, held=2)
    ledger = Ledger()
    worker, runner = _start(app, ledger, held=2)
    held = sorted(job_id for job_id in worker._inflight if job_id != 1)
    try:
        clock.armed.set()
        assert clock.waiting.wait(10), "the heartbeat never beat"
        clock.fail_start.set()
        finish.set()  # the executor goes on to the next held job, whose start raises
        assert clock.failed.wait(10), "the fault never happened"
        ledger.told.wait(2)  # (with the fix, the release waits for the beat instead)
        clock.go.set()
        for _ in range(100):
            with ledger.lock:
                if ledger.released_ids:
                    break
            threading.Event().wait(0.05)
    finally:
        clock.go.set()
        finish.set()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    errored = [job_id for job_id, told in ledger.released_ids.items() if "error" in told]
    assert len(errored) == 1, ledger.released_ids
    (given_back,) = errored
    assert ledger.released_ids[given_back] == ["error"] and given_back in held
    assert _lost(app, [given_back]) == {}, "a job given back cleanly was traced as its lease lost"


class SlowToHear(replayq.Observer):
    """An observer that takes its time over ``settled`` (a log shipper, a slow exporter)."""

    def settled(self, job: replayq.Job) -> None:
        threading.Event().wait(0.4)


def test_a_settled_job_is_not_beaten_while_its_executor_finishes(
    app_factory: AppFactory,
) -> None:
    """A job's settle commits (here its death), then its executor tells the observers and
    releases its context before forgetting the job: meanwhile a beat extended its lease,
    found it gone and traced ``lease.lost`` after ``job.dead`` (and counted it in
    ``replayq_leases_lost_total``). Settled under its ``beat``, it is beaten no more."""
    app = app_factory()

    @app.job("no", lease="30s", heartbeat="0.05s", retry=replayq.Retry(max_attempts=1))
    def no(ctx: replayq.Context, n: int) -> None:
        raise replayq.ValidationError("never valid")

    ids = [app.enqueue("no", {"n": n}) for n in range(2)]
    worker = replayq.Worker(
        app, worker_id="w", concurrency=1, burst=True, poll_interval=0.05, observers=[SlowToHear()]
    )
    runner = threading.Thread(target=worker.run, name="burst")
    runner.start()
    runner.join(20)
    stuck = runner.is_alive()
    if stuck:
        worker.stop()
        worker.stop()
        runner.join(30)
    assert not stuck
    for job_id in ids:
        names = [e.name for e in app.trace(job_id)]
        assert names == ["job.enqueued", "job.leased", "job.failed", "job.dead"], names
