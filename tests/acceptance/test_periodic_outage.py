"""Missed slots when "the database was down" (docs/operations.md, "Periodic jobs"): two
worker processes run the scheduler of a per-second ``run_all`` schedule while another
process holds the SQLite file's write lock for 3 s (12 slots of the app's sped-up clock),
far past the URL's 200 ms ``busy_timeout``. Once the lock is gone every slot of the outage
is enqueued (``run_all``), each exactly once, with no gap, and the jobs run.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.acceptance.test_sqlite_faults import HOLD_LOCK
from tests.acceptance.workers import WorkerLauncher, wait_for, workers_ended
from tests.apps import periodic

SPEED = 4.0  # four one-second slots a real second
OUTAGE = 3.0  # real seconds: 12 slots


@pytest.mark.timeout(90)
def test_the_slots_of_an_outage_are_each_enqueued_once_after_it(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    database = tmp_path / "queue.db"
    launcher = WorkerLauncher(f"sqlite:///{database}?busy_timeout=200", tmp_path)
    env = {"PERIODIC_EPOCH": str(time.time()), "PERIODIC_SPEED": str(SPEED)}
    os.environ.update(env)  # this process's app reads the same virtual clock
    app = periodic.build(launcher.url)

    def slots() -> list[float]:
        return sorted(j.run_at for j in app.list_jobs(job_type="tick", limit=10_000))

    try:
        with workers_ended(request, launcher):
            for name in ("a", "b"):
                launcher.start(f"scheduler-{name}", app="tests.apps.periodic:app", env=env)
            wait_for(lambda: len(slots()) >= 4, timeout=30, what="the schedule under way")
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLD_LOCK, str(database), str(OUTAGE)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            during = app.clock.now()
            assert holder.wait(30) == 0
            holder.stdout.close()
            after = app.clock.now()
            assert after - during >= OUTAGE * SPEED, "the lock outlasted 12 slots"
            wait_for(
                lambda: len([s for s in slots() if s > after + 4]) > 0,
                timeout=30,
                what="the schedule going on after the outage",
            )
            wait_for(
                lambda: all(
                    j.state.value == "succeeded"
                    for j in app.list_jobs(job_type="tick", limit=10_000)
                    if j.run_at <= after
                ),
                timeout=30,
                what="the outage's slot jobs to run",
            )
            launcher.kill_all()
            for worker in launcher.started:
                assert "Traceback" not in worker.log(), worker.log()
        message_ids = Counter(j.message_id for j in app.list_jobs(job_type="tick", limit=10_000))
        assert [m for m, n in message_ids.items() if n > 1] == [], "a slot enqueued twice"
        ran = slots()
        outage = [s for s in ran if during <= s <= after]
        assert len(outage) >= OUTAGE * SPEED - 1, f"the outage's slots: {outage}"
        assert [b - a for a, b in itertools.pairwise(ran)] == [1.0] * (len(ran) - 1), (
            "no slot missing between the first and the last"
        )
    finally:
        for key in env:
            os.environ.pop(key, None)
        app.close()
