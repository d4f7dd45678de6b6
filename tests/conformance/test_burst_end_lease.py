"""A job leased just as a burst run ends is run, or given back unstarted; never released
as if it had started.

The race: an executor that freed its slot leases while the dispatcher, having found
nothing held and nothing due, decides that the burst run is over. Leasing closes under the
lease lock, so a lease already under way keeps its job (``A burst run that returned leases
nothing more``): that job must then run in the run's grace, or, past the grace, go back to
the queue as if never leased (``lease.released`` with ``started: false``, its attempt taken
back, the observers told ``released``). Before, a burst run after another on the same
``Worker`` inherited the first one's forced end (its grace over at once) and released the
job as started (an attempt counted) while an executor could still start it; and a job
left unstarted past the grace was released as started too.

The window is hit every time: the executor's lease waits until the dispatcher has decided
to end, and the dispatcher returns only once that lease has claimed its job (an observer
sees its ``job.leased`` commit), on both backends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import replayq
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]


class _LeasedAsTheRunEnds(replayq.Worker):
    """A burst worker whose next run ends while one of its executors leases: that lease
    waits for the dispatcher's decision to end, and the decision is returned only once
    the lease has claimed the jobs ``enqueue`` made then."""

    def __init__(
        self,
        app: replayq.App,
        enqueue: Callable[[], list[int]],
        started: threading.Event | None = None,
        **options: object,
    ):
        self.claimed = threading.Event()
        # Set by the handler of a held job as it starts: the run's wind-down waits for it
        # before it looks at what is held (with no grace, the executor may not yet have
        # reached the job it leased: given back unstarted, that is another case).
        self._started = started
        # Set once the run that raced waits in its grace, or gave up a job it leased then
        # (its ``lease.released`` committed): what the late job's handler waits for.
        self.in_grace = threading.Event()
        self._wind_down_looks = 0
        self.leased_then: list[int] = []
        self.racing = False
        self._decided = threading.Event()
        self._enqueue = enqueue
        self.ledger = Ledger()
        super().__init__(
            app,
            burst=True,
            poll_interval=0.02,
            observers=[self.ledger, _SeesLeases(self)],
            **options,  # type: ignore[arg-type]
        )

    def _lease_free_slots(self) -> tuple[int, list[replayq.Job]]:
        if self.racing and threading.current_thread().name.startswith("replayq-exec"):
            assert self._decided.wait(30), "the dispatcher never decided to end"
        return super()._lease_free_slots()

    def _burst_done(self, now: float) -> bool:
        done = super()._burst_done(now)
        if done and self.racing:
            self.racing = False
            self.leased_then = self._enqueue()
            self._decided.set()  # the executor's lease goes on now
            assert self.claimed.wait(30), "the executor's lease never claimed the jobs"
        return done

    def _release_unstarted(self) -> None:
        # Called once leasing is closed, then at each look of the grace's wait: a second
        # call in the run that raced is the grace waiting for the jobs still held.
        if self.leased_then:
            if self._started is not None and self._wind_down_looks == 0:
                assert self._started.wait(30), "the first job leased as the run ended never ran"
            self._wind_down_looks += 1
            if self._wind_down_looks == 2:
                self.in_grace.set()
        super()._release_unstarted()


class _SeesLeases(replayq.Observer):
    """Tells the worker when its racing lease's ``job.leased`` events committed."""

    def __init__(self, worker: _LeasedAsTheRunEnds) -> None:
        self.worker = worker

    def events(self, events: Sequence[replayq.TraceEvent]) -> None:
        wanted = set(self.worker.leased_then)
        if wanted and wanted <= {e.job_id for e in events if e.name == "job.leased"}:
            self.worker.claimed.set()
        if wanted & {e.job_id for e in events if e.name == "lease.released"}:
            self.worker.in_grace.set()


def _define(
    app: replayq.App,
    ran: list[int],
    holds: dict[int, threading.Event],
    started: threading.Event | None = None,
) -> None:
    no_jitter = replayq.Retry(max_attempts=5, base="60s", cap="60s", jitter="none")

    @app.job("unavailable", retry=no_jitter)
    def unavailable(ctx: replayq.Context) -> None:
        # Fails, its retry 60 s away: its executor frees the slot without an ack waiting
        # and leases for it; the dispatcher finds nothing held and nothing due.
        raise replayq.DependencyError("503 Service Unavailable")

    @app.job("work")
    def work(ctx: replayq.Context, n: int) -> int:
        ran.append(n)
        if n in holds:
            if started is not None:
                started.set()
            assert holds[n].wait(30), "the running job was never let go on"
        return n


def test_a_job_leased_as_a_later_burst_run_ends_runs_in_its_grace(
    app_factory: AppFactory,
) -> None:
    """Two burst runs of one ``Worker``: the second ends while an executor leases. The job
    it leased runs (in the grace) and succeeds, once; before, the first run's forced end
    carried over: the grace was over at once and the job released under its running
    handler (its ack then refused), or, not yet started, released as started (its attempt
    counted) while its executor could still start it."""
    app = app_factory()
    ran: list[int] = []
    worker = _LeasedAsTheRunEnds(app, lambda: [app.enqueue("work", {"n": 2})])
    # The late job runs until the run waits for it in its grace (or gave it up): it is
    # still running when the wind-down looks at what is held.
    _define(app, ran, {2: worker.in_grace})

    app.enqueue("work", {"n": 1})
    first = worker.run()
    assert first.succeeded == 1

    app.enqueue("unavailable")
    worker.racing = True
    second = worker.run()
    [late] = worker.leased_then
    assert worker.claimed.is_set() and not worker.racing
    job = app.get_job(late)
    names = [e.name for e in app.trace(late)]
    assert job.state == replayq.JobState.SUCCEEDED, names
    assert ran == [1, 2], "each job ran once"
    assert "lease.released" not in names
    assert job.attempt == 1
    # One ``WorkerStats`` for the worker's runs: the second added one success, one retry.
    assert (second.succeeded, second.retried, second.released) == (2, 1, 0)


def test_a_job_leased_as_a_burst_run_ends_and_not_started_in_its_grace_goes_back_unstarted(
    app_factory: AppFactory,
) -> None:
    """The executor's lease (as the run ends) takes two jobs: it runs the first, which is
    still running when the grace (0 s here) is over; the second, never started, goes back
    as if never leased (``started: false``, its attempt taken back, ``released`` to the
    observers), and only the running one is released as started. Before, both were
    released as started."""
    app = app_factory()
    ran: list[int] = []
    hold, started = threading.Event(), threading.Event()
    _define(app, ran, {1: hold}, started)
    worker = _LeasedAsTheRunEnds(
        app,
        lambda: [app.enqueue("work", {"n": n}) for n in (1, 2)],
        started,
        grace_period=0,
        prefetch=1,
        prefetch_window=float("inf"),  # the second job is leased ahead of the free executor
    )
    app.enqueue("unavailable")
    worker.racing = True
    try:
        stats = worker.run()  # returns past its grace: the first job still runs
    finally:
        hold.set()
    running, unstarted = worker.leased_then
    assert ran == [1], "only the first job started"
    assert stats.released == 2

    back = app.get_job(unstarted)
    (released,) = [e for e in app.trace(unstarted) if e.name == "lease.released"]
    assert released.data.get("started") is False, released.data
    assert back.state == replayq.JobState.QUEUED and back.attempt == 0
    assert worker.ledger.released_ids.get(unstarted) == ["stopped"]
    assert worker.ledger.attempts[unstarted] == 0

    (stopped,) = [e for e in app.trace(running) if e.name == "lease.released"]
    assert "started" not in stopped.data
    assert app.get_job(running).attempt == 1, "the attempt that ran is counted"
