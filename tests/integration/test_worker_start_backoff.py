"""A worker whose start of a job raises every time does not lease and give back the same
jobs in a hot loop, and does not bury them for a fault of its own.

``Executing._unstartable`` gives a job whose start raised back to the queue unstarted (no
attempt counted, ``lease.released`` with ``started: false``). Before, a start that raised
every time (a bug, an app's lease clock erring) had the worker lease the job again at
once, and give it back again, each time a ``lease.released`` in its trace, as fast as its
transactions went. Now this worker leases nothing for a backoff's delay after a start
error (doubled at each one in a row, reset by a start that succeeds). No job is buried
for a worker-wide fault; a job whose start raised on several of its leases in a row
while the worker started other jobs (the fault follows that job) is parked in ``dead``
with reason ``start_failed`` naming the error.

The fault is a ``Worker`` subclass whose ``_start`` raises (for every job, or for one);
real workers ``run()`` on real databases, the give-backs seen by an observer.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import replayq
from replayq.model import Job
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]


class _GiveBacks(Ledger):
    """A ``Ledger`` that notes when (monotonic) each give-back for an error was told, and
    sets ``enough`` at the ``wanted``-th."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.at: list[float] = []
        self.wanted = wanted
        self.enough = threading.Event()

    def released(self, job: replayq.Job, reason: replayq.ReleaseReason) -> None:
        super().released(job, reason)
        if str(reason) == "error":
            with self.lock:
                self.at.append(time.monotonic())
                if len(self.at) >= self.wanted:
                    self.enough.set()


class _StartAlwaysFails(replayq.Worker):
    """Its start of every job raises: a fault of the worker's own."""

    start_backoff_first = 0.2
    start_errors_to_park = 2  # fewer than the give-backs seen: still no job buried

    def _start(self, job: Job, now: float) -> bool:
        raise RuntimeError("the lease clock is broken")


def test_a_worker_whose_every_start_raises_backs_off_and_buries_nothing(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("work", lease="30s")
    def work(ctx: replayq.Context) -> None:
        raise AssertionError("never started")

    job_id = app.enqueue("work")
    ledger = _GiveBacks(wanted=4)
    worker = _StartAlwaysFails(app, worker_id="w", poll_interval=0.01, observers=[ledger])
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    try:
        assert ledger.enough.wait(30), ledger.released_ids
    finally:
        worker.stop()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    with ledger.lock:
        at = list(ledger.at)
    # Each give-back waits at least the backoff's delay (0.2 s doubled each time, jittered
    # down to half) before the job is leased again: 0.1 s, 0.2 s, 0.4 s at least. Before,
    # the next lease and give-back followed at once (milliseconds apart).
    gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
    floors = [0.1, 0.2, 0.4]
    assert all(gap >= floor for gap, floor in zip(gaps, floors, strict=False)), gaps
    job = app.get_job(job_id)
    names = [e.name for e in app.trace(job_id)]
    # A fault of the worker's buries nothing, however many times in a row it met the job.
    assert job.state is not replayq.JobState.DEAD and "job.dead" not in names, names
    assert job.attempt == 0, "an unstarted give-back counted an attempt"
    released = [e for e in app.trace(job_id) if e.name == "lease.released"]
    assert len(released) == len(at) >= 4, names
    assert all(e.data["started"] is False for e in released)


class _StartFailsForOne(replayq.Worker):
    """Its start of the job ``bad`` raises; every other job starts."""

    start_backoff_first = 0.01
    start_backoff_cap = 0.05
    start_errors_to_park = 3

    def _start(self, job: Job, now: float) -> bool:
        if job.job_type == "bad":
            raise RuntimeError("this job cannot be started")
        return super()._start(job, now)


def test_a_job_whose_start_raises_while_others_start_is_parked_as_start_failed(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    ran: list[int] = []

    @app.job("bad")
    def bad(ctx: replayq.Context) -> None:
        raise AssertionError("never started")

    @app.job("good")
    def good(ctx: replayq.Context, n: int) -> None:
        ran.append(n)
        # A chain of good jobs runs while the bad one is leased and given back.
        if n < 40 and app.get_job(bad_id).state is not replayq.JobState.DEAD:
            ctx.enqueue("good", {"n": n + 1})

    bad_id = app.enqueue("bad")
    app.enqueue("good", {"n": 1})
    ledger = Ledger()
    # Two slots: a lease takes the bad job and a good one (the bad one, given back, is
    # first in the queue again: one slot would lease it alone each time).
    worker = _StartFailsForOne(
        app, worker_id="w", burst=True, concurrency=2, poll_interval=0.01, observers=[ledger]
    )
    stuck = _burst(worker, 60)
    job = app.get_job(bad_id)
    names = [e.name for e in app.trace(bad_id)]
    assert not stuck, (
        f"the burst run never ended: the bad job was given back "
        f"{names.count('lease.released')} times"
    )
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "start_failed"), (
        job.state,
        job.dead_reason,
        names,
    )
    error = job.last_error or ""
    assert "RuntimeError: this job cannot be started" in error, error
    assert "3 of its leases in a row" in error, error
    assert names.count("lease.released") == 2, names  # given back twice, parked the third
    assert ledger.released_ids[bad_id] == ["error", "error", "error"]
    assert ledger.attempts[bad_id] == 0
    assert ran and ran == list(range(1, len(ran) + 1)), ran  # each good job ran once


class _StartFailsForFlaky(replayq.Worker):
    """Its start of the job ``flaky`` raises (at any attempt); every other job starts. Its
    backoff is long enough for another worker to take the job given back."""

    start_backoff_first = 3.0
    start_backoff_cap = 3.0
    start_errors_to_park = 2

    def _start(self, job: Job, now: float) -> bool:
        if job.job_type == "flaky":
            raise RuntimeError("this job cannot be started here")
        return super()._start(job, now)


def test_start_errors_before_the_job_ran_elsewhere_do_not_count_toward_its_park(
    app_factory: AppFactory,
) -> None:
    """A job whose start raised here, then ran elsewhere (an attempt counted), is not
    parked at its next start error here as if that were the second in a row."""
    app = app_factory()

    @app.job("flaky", retry=replayq.Retry(max_attempts=5, base="2s", cap="2s", jitter="none"))
    def flaky(ctx: replayq.Context) -> None:
        raise replayq.TransientError("the first attempt fails; retried")

    @app.job("good")
    def good(ctx: replayq.Context, n: int) -> None:
        # A chain of good jobs runs here while the flaky one is leased and given back.
        time.sleep(0.01)
        if n < 2000 and app.get_job(flaky_id).state is not replayq.JobState.DEAD:
            ctx.enqueue("good", {"n": n + 1})

    flaky_id = app.enqueue("flaky")
    ledger = _GiveBacks(wanted=1)
    worker = _StartFailsForFlaky(
        app, worker_id="w", concurrency=2, poll_interval=0.01, observers=[ledger]
    )
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    try:
        assert ledger.enough.wait(30), "the flaky job was never leased here"
        # While ``w`` backs off (1.5 s at least), another worker runs the job's first
        # attempt: it fails and is retried 2 s later.
        other = replayq.Worker(app, worker_id="other", burst=True, poll_interval=0.01)
        other.run()
        assert app.get_job(flaky_id).attempt == 1, [e.name for e in app.trace(flaky_id)]
        app.enqueue("good", {"n": 1})  # ``w`` starts other jobs meanwhile
        deadline = time.monotonic() + 30
        while app.get_job(flaky_id).state is not replayq.JobState.DEAD:
            assert time.monotonic() < deadline, [e.name for e in app.trace(flaky_id)]
            time.sleep(0.05)
    finally:
        worker.stop()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    events = app.trace(flaky_id)
    # Its second attempt's leases here: given back at least once (its first start error),
    # parked at a later one. Before, the error here before its first attempt ran (on the
    # other worker) counted as the first of the row: parked at its first start error.
    given_back = [e for e in events if e.name == "lease.released" and e.attempt == 2]
    job = app.get_job(flaky_id)
    assert job.dead_reason == "start_failed", job.dead_reason
    assert len(given_back) >= 1, [(e.name, e.attempt) for e in events]


def test_a_one_slot_worker_parks_the_head_job_whose_start_raises_and_runs_the_others(
    app_factory: AppFactory,
) -> None:
    """One slot, the bad job first in the queue: given back, it was first again, so each
    lease took it alone and no other job was started in between. It was never parked and
    the jobs behind it never ran (the burst run never ended). Now the lease after its
    start error passes over it once: a good job starts in between, and the bad one is
    parked at its third start error in a row."""
    app = app_factory()
    ran: list[int] = []

    @app.job("bad")
    def bad(ctx: replayq.Context) -> None:
        raise AssertionError("never started")

    @app.job("good")
    def good(ctx: replayq.Context, n: int) -> None:
        ran.append(n)

    bad_id = app.enqueue("bad")
    good_ids = [app.enqueue("good", {"n": n}) for n in range(1, 6)]
    ledger = Ledger()
    worker = _StartFailsForOne(
        app, worker_id="w", burst=True, concurrency=1, poll_interval=0.01, observers=[ledger]
    )
    stuck = _burst(worker)
    job = app.get_job(bad_id)
    names = [e.name for e in app.trace(bad_id)]
    assert not stuck, (
        f"the burst run never ended: the bad job was given back "
        f"{names.count('lease.released')} times, the good jobs ran {ran}"
    )
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "start_failed"), names
    error = job.last_error or ""
    assert "RuntimeError: this job cannot be started" in error, error
    assert "3 of its leases in a row" in error, error
    assert names.count("lease.released") == 2, names  # given back twice, parked the third
    assert ledger.attempts[bad_id] == 0
    # Nothing else harmed: each good job ran once and succeeded.
    assert sorted(ran) == [1, 2, 3, 4, 5], ran
    assert all(app.get_job(i).state is replayq.JobState.SUCCEEDED for i in good_ids)


class _StartFailsForRetried(replayq.Worker):
    """Its start of the job ``flaky`` raises; every other job starts."""

    start_backoff_first = 0.01
    start_backoff_cap = 0.05
    start_errors_to_park = 2

    def _start(self, job: Job, now: float) -> bool:
        if job.job_type == "flaky":
            raise RuntimeError("this job cannot be started here")
        return super()._start(job, now)


def test_a_dry_run_of_a_job_parked_start_failed_replays_its_last_attempt_and_its_decision(
    app_factory: AppFactory,
) -> None:
    """A job whose first attempt failed and was retried, then parked ``start_failed`` (its
    second attempt never started): a dry-run replays the first attempt, whose decision was
    the retry, recorded and now. The park is not that attempt's decision (its ``job.dead``
    is the unstarted second attempt's), and a replay always starts the handler: no start
    fault is reproduced, so ``start_failed`` is never a decision now."""
    from replayq.replay.engine import dry_run

    app = app_factory()

    @app.job("flaky", retry=replayq.Retry(max_attempts=3, base="0.05s", cap="0.05s", jitter="none"))
    def flaky(ctx: replayq.Context) -> None:
        ctx.decide("try", 1)
        raise replayq.TransientError("the carrier is down")

    @app.job("good")
    def good(ctx: replayq.Context, n: int) -> None:
        pass

    flaky_id = app.enqueue("flaky")
    replayq.Worker(app, worker_id="first", burst=True, poll_interval=0.01).run()  # attempt 1
    assert app.get_job(flaky_id).attempt == 1
    time.sleep(0.1)  # its retry is due
    for n in range(3):
        app.enqueue("good", {"n": n})
    _StartFailsForRetried(app, worker_id="w", burst=True, poll_interval=0.01).run()
    job = app.get_job(flaky_id)
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "start_failed"), [
        e.name for e in app.trace(flaky_id)
    ]

    report = dry_run(app, flaky_id, keep=False)

    assert report.attempt == 1
    assert report.retry_recorded == "retry in ≤ 0.1 s (attempt 2 of 3)", report.retry_recorded
    assert report.retry_now == report.retry_recorded
    assert not report.diverged, report.to_dict()


class _StartFailsOnceForBad(replayq.Worker):
    """Its first start of each ``bad`` job raises (a passing fault); later starts succeed."""

    start_backoff_first = 0.01
    start_backoff_cap = 0.05

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raised: set[int] = set()

    def _start(self, job: Job, now: float) -> bool:
        if job.job_type == "bad" and job.id not in self.raised:
            self.raised.add(job.id)
            raise RuntimeError("this start fails once")
        return super()._start(job, now)


def _burst(worker: replayq.Worker, seconds: float = 30) -> bool:
    """Run ``worker`` (a burst run) to its end; ``True`` if it had not ended in ``seconds``
    (it is stopped then)."""
    runner = threading.Thread(target=worker.run, name="burst")
    runner.start()
    runner.join(seconds)
    stuck = runner.is_alive()
    if stuck:
        worker.stop()
        worker.stop()
        runner.join(30)
    return stuck


def test_a_burst_run_does_not_end_while_the_one_job_it_passed_over_is_due(
    app_factory: AppFactory,
) -> None:
    """One slot, one job, whose first start raises: the lease after the give-back passes
    it over (``Leasing._skips_taken``) and so leases nothing. That lease is not the end of
    the burst run (``_lease_skipped``): the job, due and queued, is leased at the next
    poll and runs. Ending there would leave it queued with the run reported done."""
    app = app_factory()
    ran: list[int] = []

    @app.job("bad")
    def bad(ctx: replayq.Context) -> None:
        ran.append(1)

    job_id = app.enqueue("bad")
    worker = _StartFailsOnceForBad(app, worker_id="w", burst=True, poll_interval=0.01)

    assert not _burst(worker), "the burst run never ended"
    job = app.get_job(job_id)
    names = [e.name for e in app.trace(job_id)]
    assert job.state is replayq.JobState.SUCCEEDED, (job.state, names)
    assert ran == [1], ran
    assert names.count("lease.released") == 1, names  # given back once, then run


def test_a_passed_over_head_of_an_ordering_key_keeps_its_key_in_order(
    app_factory: AppFactory,
) -> None:
    """One slot; the bad job heads its ordering key, a good job of the same key behind it,
    a good job of another key after both. Passed over after each start error, the bad job
    still holds its key: the next of its key never overtakes it (it runs only once the bad
    one is parked), while the other key's job runs in between (which is what parks it)."""
    app = app_factory()
    ran: list[str] = []

    @app.job("bad", ordering="{key}")
    def bad(ctx: replayq.Context, key: str) -> None:
        raise AssertionError("never started")

    @app.job("good", ordering="{key}")
    def good(ctx: replayq.Context, key: str, name: str) -> None:
        ran.append(name)

    bad_id = app.enqueue("bad", {"key": "k"})
    app.enqueue("good", {"key": "k", "name": "same key, behind it"})
    app.enqueue("good", {"key": "other", "name": "other key"})
    worker = _StartFailsForOne(app, worker_id="w", burst=True, poll_interval=0.01)

    assert not _burst(worker), f"the burst run never ended: the good jobs ran {ran}"
    job = app.get_job(bad_id)
    names = [e.name for e in app.trace(bad_id)]
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "start_failed"), names
    assert ran == ["other key", "same key, behind it"], ran
