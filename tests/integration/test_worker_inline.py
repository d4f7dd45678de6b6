"""``Worker.lease()`` then ``Worker.execute(job)`` (the inline path, ``run_inline``'s) forgets
each job once its attempt settled, as the executors do.

Before, the inline path never took a job out of the worker's in-flight table, nor off
the executors' work queue its lease had put it on: each job it ran stayed in both, with
its ended context, for the life of the worker (a long inline loop grew by one of each per
job). A worker that ran jobs inline and then ``run()`` (here a burst run, on real
databases) had its executors take those jobs up again as held, unstarted ones: each
handler ran a second time, its settle was refused (``job.write_rejected``: the job had
succeeded already) and the observers heard ``settled`` twice for it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import replayq
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]


def test_jobs_run_inline_leave_the_worker_which_then_runs_on(app_factory: AppFactory) -> None:
    app = app_factory()

    ran: Counter[int] = Counter()

    @app.job("ok", lease="5s", heartbeat="0.1s")
    def ok(ctx: replayq.Context, n: int) -> int:
        ran[n] += 1
        return n

    @app.job("no", lease="5s", heartbeat="0.1s", retry=replayq.Retry(max_attempts=1))
    def no(ctx: replayq.Context, n: int) -> int:
        ran[n] += 1
        raise replayq.ValidationError("never valid")

    ledger = Ledger()
    # One slot: a single job left in the table is enough to fill it.
    worker = replayq.Worker(
        app, worker_id="inline", prefetch=0, burst=True, poll_interval=0.05, observers=[ledger]
    )
    app.register_contracts()
    inline = [app.enqueue("ok", {"n": 1}), app.enqueue("no", {"n": 2}), app.enqueue("ok", {"n": 3})]
    for _ in inline:
        (job,) = worker.lease(1)
        worker.execute(job)
        assert job.id not in worker._inflight, "a job run inline stayed in flight"
    assert not worker._inflight
    assert worker._work.empty(), "jobs run inline stayed queued for the executors"

    # The same worker then drains a new job in a burst run, and the run ends.
    later = app.enqueue("ok", {"n": 4})
    runner = threading.Thread(target=worker.run, name="burst")
    runner.start()
    runner.join(10)
    stuck = runner.is_alive()
    if stuck:
        worker.stop()
        worker.stop()  # a second stop forces: no grace
        runner.join(30)
    assert not stuck, "the burst run never ended: it counted the inline jobs as held"
    assert app.get_job(later).state is replayq.JobState.SUCCEEDED
    assert ran == Counter({1: 1, 2: 1, 3: 1, 4: 1}), "a handler ran twice"

    states = [app.get_job(job_id).state for job_id in inline]
    succeeded, dead = replayq.JobState.SUCCEEDED, replayq.JobState.DEAD
    assert states == [succeeded, dead, succeeded]
    for job_id in inline:
        names = [e.name for e in app.trace(job_id)]
        # One lease, one outcome: no second run refused, no beat or release of it.
        assert names.count("job.leased") == 1, names
        refused = {"job.write_rejected", "lease.extended", "lease.lost", "lease.released"}
        assert not refused & set(names), names
    # Each job left the observers once, settled; none released.
    assert ledger.settled_ids == Counter([*inline, later]), ledger.settled_ids
    assert ledger.released_ids == {}
    assert (worker.stats.rejected, worker.stats.released, worker.stats.lost) == (0, 0, 0)
