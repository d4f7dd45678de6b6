"""A worker SIGKILLed mid-handler loses nothing: its jobs are re-delivered after the lease."""

from __future__ import annotations

import signal
from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for

JOBS = 6


def test_sigkilled_worker_jobs_are_redelivered_and_all_succeed(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    ids = [
        sleepy_app.enqueue("sleep", {"log": str(side_file), "n": n, "seconds": 1.0})
        for n in range(JOBS)
    ]
    doomed = launcher.start("doomed", concurrency=2)
    wait_for(
        lambda: any(line["event"] == "start" for line in read_lines(side_file)),
        timeout=20,
        what="the first worker to start a handler",
    )

    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    cut_short = [
        job.id for job in sleepy_app.list_jobs(states=["running"]) if job.worker_id == "doomed"
    ]
    assert cut_short, "the kill should have interrupted at least one running handler"

    launcher.start("survivor", concurrency=3)
    wait_for(
        lambda: len(sleepy_app.list_jobs(states=["succeeded"])) == JOBS,
        timeout=30,
        what=f"all {JOBS} jobs to succeed",
    )

    jobs = {job.id: job for job in sleepy_app.list_jobs(limit=1000)}
    assert sorted(jobs) == sorted(ids), "N enqueued, N in the queue: nothing lost or invented"
    assert all(job.state is replayq.JobState.SUCCEEDED for job in jobs.values())
    finished = [line["n"] for line in read_lines(side_file) if line["event"] == "end"]
    assert sorted(set(finished)) == list(range(JOBS)), "every job's handler ran to the end"

    for job_id in cut_short:
        job = jobs[job_id]
        assert job.redelivery_count == 1
        assert job.attempt == 2
        names = [(event.name, event.worker_id) for event in sleepy_app.trace(job_id)]
        assert ("job.leased", "doomed") in names
        assert ("lease.expired", "survivor") in names
        assert ("job.redelivered", "survivor") in names
        assert names[-1] == ("job.succeeded", "survivor")
        expired = [n for n, _ in names].index("lease.expired")
        assert [n for n, _ in names].index("job.redelivered") > expired
