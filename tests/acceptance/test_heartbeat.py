"""A live job that heartbeats is never reaped, however long it runs past its lease."""

from __future__ import annotations

from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for


def test_heartbeating_job_running_five_leases_is_not_reaped_and_runs_once(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    lease = sleepy_app.handler("sleep").contract.lease
    job_id = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 1, "seconds": 5 * lease})
    # Two workers, so that a wrongly reaped job would be picked up and run a second time.
    first = launcher.start("first")
    wait_for(lambda: read_lines(side_file), timeout=20, what="the job to start")
    launcher.start("second")

    wait_for(
        lambda: sleepy_app.get_job(job_id).state is replayq.JobState.SUCCEEDED,
        timeout=30,
        what="the long job to succeed",
    )

    starts = [line for line in read_lines(side_file) if line["event"] == "start"]
    assert len(starts) == 1, f"the handler ran {len(starts)} times"
    assert starts[0]["pid"] == first.pid
    job = sleepy_app.get_job(job_id)
    assert (job.attempt, job.redelivery_count) == (1, 0)
    events = [e.name for e in sleepy_app.trace(job_id)]
    assert "lease.expired" not in events
    assert "job.redelivered" not in events
    assert events.count("job.leased") == 1
    assert events.count("lease.extended") >= 10, "a heartbeat every 0.3s for 5s"
