"""SIGTERM: in-flight jobs finish within the grace period, or go back to the queue."""

from __future__ import annotations

import signal
from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for


def test_sigterm_lets_the_in_flight_job_finish_within_grace(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    job_id = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 1, "seconds": 1.0})
    sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 2, "seconds": 0.1})
    worker = launcher.start("graceful", grace=10)
    wait_for(lambda: read_lines(side_file), timeout=20, what="the job to start")

    worker.signal(signal.SIGTERM)

    assert worker.wait(15) == 0, worker.log()
    job = sleepy_app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED
    assert [line["n"] for line in read_lines(side_file) if line["event"] == "end"] == [1]
    second = next(j for j in sleepy_app.list_jobs() if j.id != job_id)
    assert second.state is replayq.JobState.QUEUED, "a stopping worker leases nothing new"
    assert second.attempt == 0


def test_sigterm_with_short_grace_releases_the_job_back_to_the_queue(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    job_id = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 1, "seconds": 1.5})
    worker = launcher.start("hasty", grace=0.2)
    wait_for(lambda: read_lines(side_file), timeout=20, what="the job to start")

    worker.signal(signal.SIGTERM)

    assert worker.wait(15) == 0, worker.log()
    job = sleepy_app.get_job(job_id)
    assert job.state is replayq.JobState.QUEUED
    assert job.owner_token is None
    # A release is not a failed attempt: the budget grows by one. The attempt number is
    # kept, so the next run's events and outbox ids never collide with the released run's.
    assert (job.attempt, job.max_attempts) == (1, 6)
    released = [e for e in sleepy_app.trace(job_id) if e.name == "lease.released"]
    assert [e.worker_id for e in released] == ["hasty"]

    launcher.start("next", burst=True).wait(20)
    done = sleepy_app.get_job(job_id)
    assert done.state is replayq.JobState.SUCCEEDED, "nothing is lost"
    assert done.attempt == 2
