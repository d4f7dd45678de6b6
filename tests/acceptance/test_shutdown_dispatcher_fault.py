"""A worker whose dispatcher dies of an error that is not the database's stops as a stop
does: the jobs it held ahead go back unstarted at once, the running one gets the grace
period, and the process exits non-zero with the error and its traceback in its log.

``tests.apps.dispatch_fault`` is the sleepy app on a clock that fails once on the worker's
main thread (its dispatcher) when told to. The worker (one executor, four jobs leased
ahead) runs a long job while it holds four more; then the dispatcher's clock fails.

Before, only a ``StorageError`` was caught in the dispatcher: any other error went up
through ``run()`` without the worker stopping (``_stopping`` never set). Its shutdown then
gave nothing back as unstarted; its executor went on starting the held jobs through the
grace period (here it ran all four, on a worker that had already failed), and what was
still held at the grace's end was given back as if started, an attempt counted.
"""

from __future__ import annotations

from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import dispatch_fault

AHEAD = 4
PREFETCH = ("--prefetch", str(AHEAD), "--prefetch-window", "inf")


def test_a_dispatcher_that_dies_gives_back_the_held_jobs_unstarted_and_the_worker_exits(
    launcher: WorkerLauncher, side_file: Path, tmp_path: Path
) -> None:
    app = dispatch_fault.build(launcher.url)
    try:
        ids = [
            app.enqueue("sleep", {"log": str(side_file), "n": n, "seconds": 0.0 if n else 2.0})
            for n in range(AHEAD + 1)
        ]
        trigger = tmp_path / "fault"
        worker = launcher.start(
            "w1",
            app="tests.apps.dispatch_fault:app",
            grace=10,
            options=PREFETCH,
            env={"DISPATCH_FAULT": str(trigger)},
        )

        def started() -> list[int]:
            return [line["n"] for line in read_lines(side_file) if line["event"] == "start"]

        wait_for(lambda: started() == [0], timeout=30, what="w1 to start the long job")
        held = [app.get_job(job_id) for job_id in ids]
        assert [(j.state, j.worker_id) for j in held] == [(replayq.JobState.RUNNING, "w1")] * len(
            ids
        ), "the premise: w1 holds the whole batch"

        trigger.touch()  # the dispatcher's next look at the clock fails

        code = worker.wait(30)
        log = worker.log()
        assert not trigger.exists(), "the fault never happened\n" + log
        assert code != 0, log
        assert "the clock source failed" in log and "Traceback" in log, log
        assert started() == [0], "the failed worker started jobs it held ahead"

        # The running job had its grace and finished; the held ones went back unstarted:
        # as if never leased, attempt number as before.
        first = app.get_job(ids[0])
        assert first.state is replayq.JobState.SUCCEEDED, log
        for job_id in ids[1:]:
            job = app.get_job(job_id)
            assert (job.state, job.attempt, job.owner_token) == (
                replayq.JobState.QUEUED,
                0,
                None,
            ), log
            (released,) = [e for e in app.trace(job_id) if e.name == "lease.released"]
            assert released.worker_id == "w1" and released.data["started"] is False

        # Nothing lost: another worker runs them.
        assert launcher.start("w2", burst=True).wait(30) == 0
        assert all(app.get_job(i).state is replayq.JobState.SUCCEEDED for i in ids)
    finally:
        app.close()
