"""Soak: workers SIGKILLed over and over for minutes while jobs with effects run.

Marked ``soak``: not in ``make test`` or CI, run by ``make soak``. It lasts
``$REPLAYQ_SOAK_SECONDS`` (default 300) per backend. Every second or two a random
worker is SIGKILLed and a new one started, so kills land anywhere: mid-handler,
mid-claim, mid-effect, mid-commit. At the end every job is finished and each business
effect happened at most once; an effect cut off between its claim and its result is
parked (``dead``, ``effect_in_doubt``, the default ``park`` policy), never repeated,
and every other job succeeded with its effect made exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, WorkerProcess, read_lines, wait_for
from tests.apps import pg_effects

pytestmark = [pytest.mark.soak, pytest.mark.timeout(3600)]

APP = "tests.apps.pg_effects:app"
SECONDS = float(os.environ.get("REPLAYQ_SOAK_SECONDS", "300"))
WORKERS = 3


def test_repeated_sigkills_for_minutes_lose_no_job_and_repeat_no_effect(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    sink = tmp_path / "effects.jsonl"
    app = pg_effects.build(launcher.url)
    rng = random.Random(os.environ.get("REPLAYQ_SOAK_SEED", "18"))
    enqueued: list[int] = []
    started = 0
    try:
        alive: list[WorkerProcess] = []

        def start() -> None:
            nonlocal started
            started += 1
            alive.append(launcher.start(f"w{started}", app=APP, concurrency=4))

        for _ in range(WORKERS):
            start()
        kills = 0
        until = time.monotonic() + SECONDS
        while time.monotonic() < until:
            for _ in range(20):
                n = len(enqueued)
                payload = {"n": n, "sink": str(sink), "seconds": rng.uniform(0, 0.2)}
                enqueued.append(app.enqueue("charge", payload))
            time.sleep(rng.uniform(0.5, 2.0))
            victim = alive.pop(rng.randrange(len(alive)))
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            kills += 1
            start()

        def finished() -> bool:
            jobs = app.list_jobs(limit=len(enqueued) + 10)
            return all(j.state in (replayq.JobState.SUCCEEDED, replayq.JobState.DEAD) for j in jobs)

        wait_for(finished, timeout=120, what="every job to finish after the last kill")
        jobs = {j.id: j for j in app.list_jobs(limit=len(enqueued) + 10)}
        assert sorted(jobs) == sorted(enqueued), "nothing lost, nothing invented"
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert max(effects.values(), default=0) <= 1, "an effect happened twice"
        for n, job_id in enumerate(enqueued):
            job = jobs[job_id]
            if job.state is replayq.JobState.DEAD:
                assert job.dead_reason == "effect_in_doubt", (job_id, job.dead_reason)
            else:
                assert effects[n] == 1, f"job {job_id} succeeded without its effect"
        parked = sum(1 for j in jobs.values() if j.state is replayq.JobState.DEAD)
        print(
            f"\nsoak {launcher.backend}: {SECONDS:.0f}s, {kills} SIGKILLs, {len(enqueued)} jobs, "
            f"{parked} parked in doubt"
        )
    finally:
        app.close()
