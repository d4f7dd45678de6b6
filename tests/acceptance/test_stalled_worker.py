"""A worker frozen past its lease cannot write the job when it wakes (owner-token CAS)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import replayq
from replayq.model import TraceEvent
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for


@pytest.mark.parametrize("late_outcome", ["succeed", "fail"])
def test_stalled_worker_late_write_is_rejected_and_state_not_regressed(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path, late_outcome: str
) -> None:
    job_id = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 1, "seconds": 1.5})
    env = {"SLEEPY_LATE_OUTCOME": "fail"} if late_outcome == "fail" else {}
    stalled = launcher.start("stalled", env=env)
    wait_for(lambda: read_lines(side_file), timeout=20, what="the first worker to start the job")

    stalled.signal(signal.SIGSTOP)
    taker = launcher.start("taker")
    done = wait_for(
        lambda: (job := sleepy_app.get_job(job_id)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the second worker to take over the job and finish it",
    )
    assert done.worker_id == "taker"
    assert done.redelivery_count == 1

    stalled.signal(signal.SIGCONT)

    def rejected() -> list[TraceEvent]:
        return [e for e in sleepy_app.trace(job_id) if e.name == "job.write_rejected"]

    rejection = wait_for(rejected, timeout=20, what="the stalled worker's late write")[0]
    assert rejection.worker_id == "stalled"

    after = sleepy_app.get_job(job_id)
    assert after.state is replayq.JobState.SUCCEEDED, "the late write must not regress the state"
    assert after.result == done.result
    assert after.result["pid"] == taker.pid
    assert after.finished_at == done.finished_at
    assert after.attempt == done.attempt
    assert after.last_error is None
    events = [e.name for e in sleepy_app.trace(job_id)]
    assert events.count("job.succeeded") == 1
    assert "retry.scheduled" not in events
    ran_to_end = [line["pid"] for line in read_lines(side_file) if line["event"] != "start"]
    assert sorted(ran_to_end) == sorted([stalled.pid, taker.pid]), "both handlers did finish"
