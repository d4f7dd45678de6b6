"""A group commit whose lease raises an error that is not the database's still acks its jobs.

A group commit writes the buffered acks and leases the slots they free in one
transaction. An error other than a ``StorageError`` there (a bug, the app's clock
erring: the faults a dispatcher now survives by stopping) rolled it all back and gave
up the acks: jobs whose handler had succeeded stayed ``running``, held by nobody, until
their lease ran out; then they were reaped and run a second time. The fault was the
lease's, not the acks': the group now commits again without the lease (the dispatcher
leases those slots), and gives up only if that fails too.

The fault is the app's own clock (a frozen one, as a test's) failing once, on the
reading a group commit's lease makes. A real worker ``run()``, real databases.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable

import replayq

AppFactory = Callable[..., replayq.App]


class FailingInAGroupLease(replayq.FrozenClock):
    """A frozen clock whose next reading made by a group commit's lease fails, once armed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()
        self.failed = threading.Event()

    def now(self) -> float:
        if self.armed.is_set() and _reading_for_a_group_lease():
            self.armed.clear()
            self.failed.set()
            raise OSError("the clock source is unavailable")
        return super().now()


def _reading_for_a_group_lease() -> bool:
    frame = sys._getframe(2)
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return {"_commit_once", "_lease_params"} <= names


def test_a_group_whose_lease_raises_commits_its_acks_without_the_lease(
    app_factory: AppFactory,
) -> None:
    clock = FailingInAGroupLease()
    app = app_factory(clock=clock)
    ran: Counter[int] = Counter()

    @app.job("ok", lease="30s", heartbeat="10s")
    def ok(ctx: replayq.Context, n: int) -> int:
        ran[n] += 1
        return n

    ids = [app.enqueue("ok", {"n": n}) for n in range(4)]
    clock.armed.set()
    worker = replayq.Worker(app, worker_id="w", burst=True, prefetch=0, poll_interval=0.05)
    runner = threading.Thread(target=worker.run, name="burst")
    runner.start()
    runner.join(20)
    stuck = runner.is_alive()
    if stuck:
        worker.stop()
        worker.stop()
        runner.join(30)
    assert not stuck
    assert clock.failed.is_set(), "the fault never happened"

    states = {job_id: app.get_job(job_id).state for job_id in ids}
    assert states == dict.fromkeys(ids, replayq.JobState.SUCCEEDED), (
        "a job whose handler succeeded was left running (its ack given up), to be reaped "
        "and run again"
    )
    assert ran == Counter(range(4))
    for job_id in ids:
        names = [e.name for e in app.trace(job_id)]
        assert names == ["job.enqueued", "job.leased", "job.succeeded"], names
    assert worker.stats.succeeded == 4 and not worker._inflight
