"""A job whose start raises an unexpected error leaves the worker cleanly: given back to
the queue unstarted, forgotten, told to the observers (``released``, reason ``error``), the
error logged with its traceback.

Before, an error other than a ``ReplayqError`` out of ``Executing._start`` left the job held:
never run, never given back, its lease extended by every heartbeat for as long as the
worker lived, its slot taken, the observers told nothing (a burst run never ended).

The fault is the app's own: its clock (``App(clock=...)``), which judges leases when it is
not the system clock, fails once, on the executor's first reading, which is the start's
look at the lease it holds. A real worker ``run()`` (burst) on real databases.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import pytest

import replayq

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


class Ledger(replayq.Observer):
    def __init__(self) -> None:
        self.attempts: Counter[int] = Counter()
        self.settled_ids: Counter[int] = Counter()
        self.released_ids: dict[int, list[str]] = {}
        self.lock = threading.Lock()

    def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
        with self.lock:
            self.attempts[job.id] += 1
        return nullcontext()

    def settled(self, job: replayq.Job) -> None:
        with self.lock:
            self.settled_ids[job.id] += 1

    def released(self, job: replayq.Job, reason: replayq.ReleaseReason) -> None:
        with self.lock:
            self.released_ids.setdefault(job.id, []).append(str(reason))


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
