"""A worker frozen past its lease cannot write the job when it wakes (owner-token CAS), and
its handler, once the heartbeat found the lease lost, makes no further ``ctx.call``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import replayq
from replayq.model import TraceEvent
from tests.acceptance.workers import WorkerLauncher, WorkerProcess, read_lines, wait_for


def stalled_and_taken_over(
    launcher: WorkerLauncher,
    app: replayq.App,
    side_file: Path,
    job_id: int,
    env: dict[str, str] | None = None,
) -> tuple[WorkerProcess, WorkerProcess, replayq.Job]:
    """Worker ``stalled`` (``env``) starts the job and is frozen (SIGSTOP) inside it; worker
    ``taker`` takes the job over and finishes it. The two workers and the finished job;
    ``stalled`` is left frozen."""
    stalled = launcher.start("stalled", env=env)
    wait_for(lambda: read_lines(side_file), timeout=20, what="the first worker to start the job")

    stalled.signal(signal.SIGSTOP)
    taker = launcher.start("taker")
    done = wait_for(
        lambda: (job := app.get_job(job_id)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the second worker to take over the job and finish it",
    )
    return stalled, taker, done


@pytest.mark.parametrize("late_outcome", ["succeed", "fail"])
def test_stalled_worker_late_write_is_rejected_and_state_not_regressed(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path, late_outcome: str
) -> None:
    job_id = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 1, "seconds": 1.5})
    env = {"SLEEPY_LATE_OUTCOME": "fail"} if late_outcome == "fail" else {}
    stalled, taker, done = stalled_and_taken_over(launcher, sleepy_app, side_file, job_id, env)
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


def test_a_thawed_handler_whose_lease_was_taken_makes_no_further_call(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    """Frozen inside its handler, reaped and run by another worker, then thawed: its
    heartbeat finds the lease lost before the handler's next ``ctx.call``, which is not
    made (``LeaseLostError``); the job is the taker's, the stalled worker goes on."""
    job_id = sleepy_app.enqueue("nap_then_call", {"log": str(side_file), "n": 1, "naps": 30})
    stalled, taker, done = stalled_and_taken_over(launcher, sleepy_app, side_file, job_id)
    assert done.worker_id == "taker" and done.result["pid"] == taker.pid

    stalled.signal(signal.SIGCONT)

    def said(name: str) -> list[TraceEvent]:
        return [e for e in sleepy_app.trace(job_id) if e.name == name]

    rejection = wait_for(lambda: said("job.write_rejected"), timeout=20, what="its refusal")[0]
    assert rejection.worker_id == "stalled"
    assert "stops before" in rejection.data["attempted"], rejection.data
    lines = [(line["event"], line["pid"]) for line in read_lines(side_file)]
    assert ("call", stalled.pid) not in lines, "the thawed handler called out after its lease"
    assert ("stopped", stalled.pid) in lines
    assert lines.count(("call", taker.pid)) == 1
    after = sleepy_app.get_job(job_id)
    assert (after.state, after.result, after.finished_at) == (
        replayq.JobState.SUCCEEDED,
        done.result,
        done.finished_at,
    )
    names = [e.name for e in sleepy_app.trace(job_id)]
    assert names.count("job.succeeded") == 1 and "retry.scheduled" not in names

    # The stalled worker goes on with other jobs.
    taker.kill()
    late = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": 2, "seconds": 0.0})
    ran = wait_for(
        lambda: (job := sleepy_app.get_job(late)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the thawed worker to run a new job",
    )
    assert ran.result["pid"] == stalled.pid
    assert "Traceback" not in stalled.log(), stalled.log()
