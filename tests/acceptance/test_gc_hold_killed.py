"""A ``replayq fork`` or ``replayq rerun`` process SIGKILLed while it holds its source
job leaves the hold behind; gc leaves the job alone until the hold expires a day later,
then trims it as any other (docs/operations.md, "A holder that dies leaves its hold to
expire after a day").

The job is run by a real worker; the holder is a real ``replayq fork`` (its handler stalls
inside a step) or ``replayq rerun`` (held inside its step by ``storage_faults``' hold
file) process, killed holding the job; gc runs here on a clock set ahead
(``storage_faults.OffsetClock``): past the job's full tier but within the hold's day,
then past the day. The holder's own clock is the real one: the hold it wrote says when
it expires, and gc judges it by gc's clock.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

import replayq
from replayq.queue.retention import RetentionPolicy
from replayq.replay.hold import HOLD_SECONDS
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, wait_for
from tests.apps import storage_faults

DAY = 86_400.0


def holds(db: Path) -> list[tuple[str, int, float]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.execute("SELECT holder, job_id, expires_at FROM rq_gc_holds"))
    finally:
        conn.close()


def launcher_env() -> dict[str, str]:
    """This environment, the tree under test importable (as ``WorkerLauncher`` starts a worker)."""
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": python_path}


HOLDERS = {
    # A fork whose handler stalls inside its first step (it never writes its trace).
    "fork": ("fork", "--from-step", "deliver", "--handler", "tests.apps.stalled_fork:stall"),
    # A rerun of the job itself, held inside its step by the app's own hold file.
    "rerun": ("rerun", "--allow-effects", "parcel.deliver", "--yes"),
}


@pytest.mark.parametrize("command", sorted(HOLDERS))
def test_a_killed_holders_hold_keeps_gc_off_its_job_until_it_expires(
    tmp_path: Path, command: str
) -> None:
    db = tmp_path / "queue.db"
    launcher = WorkerLauncher(db, tmp_path)
    app = storage_faults.build(launcher.url)
    job_id = app.enqueue("deliver", {"n": 1, "sink": str(tmp_path / "effects.jsonl")})
    launcher.start("w", app="tests.apps.storage_faults:app", burst=True).wait(60)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert "call" in [e.name for e in app.trace(job_id)]  # a read only the full tier keeps

    hold, env = storage_faults.hold_inside_step(tmp_path)
    env["STORAGE_FAULTS_HOLD_JOB"] = "1"
    name, *options = HOLDERS[command]
    holder = subprocess.Popen(
        [REPLAYQ, "--db", launcher.url, name, str(job_id), "--app", "tests.apps.storage_faults:app",
         *options],
        cwd=ROOT, env={**launcher_env(), **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: holds(db), timeout=30, what=f"the {command} to hold its source job")
        if command == "rerun":
            wait_for(lambda: storage_faults.inside(hold), timeout=30, what="the rerun's step")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    recorded = [e.name for e in app.trace(job_id)]
    ((_, held_job, expires_at),) = holds(db)
    assert held_job == job_id
    finished = app.get_job(job_id).finished_at
    assert finished is not None and expires_at >= finished + HOLD_SECONDS - 60

    retention = RetentionPolicy(replayq.Retention(full_days=0.5, ledger_days=3), {})
    # Past the job's half-day full tier, within the hold's day: the dead holder's hold keeps it.
    within = storage_faults.build(launcher.url, offset=0.75 * DAY)
    within.retention = retention
    report = within.gc()
    within.close()
    assert report.trimmed_jobs == 0, report
    assert [e.name for e in app.trace(job_id)] == recorded

    # Past the day: the hold has expired, and gc trims the job to its ledger.
    after = storage_faults.build(launcher.url, offset=1.25 * DAY)
    after.retention = retention
    report = after.gc()
    after.close()
    assert report.trimmed_jobs == 1, report
    trimmed = [e.name for e in app.trace(job_id)]
    assert "call" not in trimmed and "job.succeeded" in trimmed, trimmed
    app.close()
