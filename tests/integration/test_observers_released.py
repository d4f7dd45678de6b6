"""Every job a worker leased leaves its observers once: ``settled`` after its attempt, or
``released(job, reason)`` when it leaves unrun; the metrics observer keeps nothing of it.

A worker tells its observers of each job it leases (``job_seen``). A job that then ran
ends with ``settled``; one that never ran used to end with nothing: dropped because its
lease was lost or not renewed while it waited leased ahead, or given back unstarted when
the worker stopped. ``WorkerMetrics`` kept the enqueue time of each leased job (and of
each job its reaper took back) until a ``settled`` that never came: one entry more per
such job, for the life of the process.

Here the jobs go through every way out, on real databases: succeeded, dead (raised a
validation error, unknown type, malformed payload), dropped unrun with the lease lost
(reaped by another worker while this one stalled: the app's frozen clock moved past the
lease), dropped unrun not renewed (a fixed visibility timeout past its window), reaped,
and given back when a running worker stops holding a prefetched batch.
``tests/acceptance/test_metrics_released.py`` scrapes the same from real worker processes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import cast

import replayq
from replayq.worker.core import STOP
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]
LEASE = 1.0


class WrittenBeforeReleased:
    """An observer of before ``released`` existed, not an ``Observer`` subclass."""

    def __init__(self) -> None:
        self.settled_ids: list[int] = []

    def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
        return nullcontext()

    def settled(self, job: replayq.Job) -> None:
        self.settled_ids.append(job.id)

    def job_seen(self, job: replayq.Job) -> None:
        return None

    def events(self, events: Sequence[replayq.TraceEvent]) -> None:
        return None


class Watched:
    """A worker with a metrics observer, a ledger and an old-style observer."""

    def __init__(self, app: replayq.App, worker_id: str, **options: object) -> None:
        self.metrics = replayq.WorkerMetrics()
        self.ledger = Ledger()
        self.old = WrittenBeforeReleased()
        observers = [self.metrics, self.ledger, cast(replayq.Observer, self.old)]
        self.worker = replayq.Worker(
            app,
            worker_id=worker_id,
            observers=observers,
            **options,  # type: ignore[arg-type]
        )

    def run_held(self) -> None:
        """Its executor takes up what it holds (as a stalled worker that resumes)."""
        self.worker._hand_out([STOP])
        self.worker._executor()

    def released(self, reason: str) -> float:
        sample = self.metrics.registry.get_sample_value
        return sum(
            sample(
                "replayq_jobs_released_total",
                {"job_type": t, "version": "v1", "queue": "default", "reason": reason},
            )
            or 0.0
            for t in ("ok", "fixed", "block")
        )


def _leased_by(app: replayq.App, worker_id: str) -> Counter[int]:
    return Counter(
        e.job_id
        for job in app.list_jobs(limit=1000)
        for e in app.trace(job.id)
        if e.name == "job.leased" and e.worker_id == worker_id and e.job_id is not None
    )


def test_every_leased_job_leaves_the_observers_once_and_the_metrics_keep_nothing_of_it(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    entered = threading.Event()
    finish = threading.Event()

    @app.job("ok", lease=f"{LEASE}s", heartbeat="0.3s")
    def ok(ctx: replayq.Context, n: int) -> int:
        return n

    @app.job("bad", lease=f"{LEASE}s", heartbeat="0.3s")
    def bad(ctx: replayq.Context, n: int) -> None:
        raise replayq.ValidationError("never valid")

    @app.job("fixed", lease=f"{LEASE}s", heartbeat=0)
    def fixed(ctx: replayq.Context, n: int) -> int:
        return n

    @app.job("block", lease="120s", heartbeat="40s")
    def block(ctx: replayq.Context, n: int) -> int:
        entered.set()
        assert finish.wait(30), "the test never let the blocking job finish"
        return n

    a = Watched(app, "a", prefetch=4)
    b = Watched(app, "b")

    # Ran and settled: succeeded, dead for a validation error, an unknown type, a payload
    # that does not fit the handler.
    app.enqueue("ok", {"n": 1})
    app.enqueue("bad", {"n": 2})
    app.enqueue("ghost", {"n": 3}, check=False)
    producer = app_factory(clock=clock)  # declares no handlers: it cannot check the payload
    producer.enqueue("ok", {"wrong": 4}, check=False)
    assert len(a.worker.lease(4)) == 4
    a.run_held()

    # Dropped unrun, lease lost: A stalled holding two jobs, B reaped them and runs them.
    lost = [app.enqueue("ok", {"n": n}) for n in (5, 6)]
    assert len(a.worker.lease(2, ahead=1)) == 2
    clock.advance(LEASE + 0.3)
    assert b.worker.reap() == 2
    assert len(b.worker.lease(2)) == 2
    a.run_held()
    b.run_held()

    # Dropped unrun, not renewed: a fixed visibility timeout past its window.
    not_renewed = app.enqueue("fixed", {"n": 7})
    assert len(a.worker.lease(1)) == 1
    clock.advance(LEASE + 0.5)
    a.run_held()
    assert b.worker.reap() == 1
    assert len(b.worker.lease(1)) == 1
    b.run_held()

    # Given back unstarted: C stops while it runs one job and holds three leased ahead.
    app.enqueue("block", {"n": 8})
    stopped = [app.enqueue("ok", {"n": n}) for n in (9, 10, 11)]
    c = Watched(app, "c", concurrency=1, prefetch=3, prefetch_window=float("inf"))
    runner = threading.Thread(target=c.worker.run, name="worker-c")
    runner.start()
    try:
        assert entered.wait(30), "C never started the blocking job"
        c.worker.stop()
    finally:
        finish.set()
        runner.join(30)
    assert not runner.is_alive()
    d = Watched(app, "d", burst=True)
    d.worker.run()

    states = Counter(job.state for job in app.list_jobs(limit=1000))
    assert states == {replayq.JobState.SUCCEEDED: 8, replayq.JobState.DEAD: 3}
    assert a.worker.stats.lost == 3 and c.worker.stats.released == 3

    # Each worker's observers heard of each lease once: settled after its attempt, or
    # released unrun, never both.
    for w in (a, b, c, d):
        leased = _leased_by(app, w.worker.worker_id)
        released = Counter({i: len(r) for i, r in w.ledger.released_ids.items()})
        assert w.ledger.settled_ids == w.ledger.attempts, w.worker.worker_id
        assert w.ledger.settled_ids + released == leased, w.worker.worker_id
        assert not (set(w.ledger.settled_ids) & set(released)), w.worker.worker_id
        assert sorted(w.old.settled_ids) == sorted(w.ledger.settled_ids.elements())
        # The metrics keep nothing of a job gone, however it went; nothing runs.
        assert w.metrics._created == {}, (w.worker.worker_id, w.metrics._created)
        assert w.metrics.registry.get_sample_value("replayq_worker_in_flight") == 0
        assert not w.worker._inflight
    assert a.ledger.released_ids == {
        lost[0]: ["lost"],
        lost[1]: ["lost"],
        not_renewed: ["not_renewed"],
    }
    assert c.ledger.released_ids == {job_id: ["stopped"] for job_id in stopped}
    assert (a.released("lost"), a.released("not_renewed"), a.released("stopped")) == (2, 1, 0)
    assert c.released("stopped") == 3
    assert b.ledger.released_ids == {} and d.ledger.released_ids == {}
