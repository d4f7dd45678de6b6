"""Two worker processes both run the scheduler of a per-second schedule: each slot once."""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter

from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import periodic

SLOTS = 30
SPEED = 4.0  # 30 one-second slots in under 8 real seconds


def test_two_schedulers_enqueue_each_of_30_slots_exactly_once(launcher: WorkerLauncher) -> None:
    env = {"PERIODIC_EPOCH": str(time.time()), "PERIODIC_SPEED": str(SPEED)}
    os.environ.update(env)  # this process's app reads the same virtual clock
    app = periodic.build(launcher.url)
    try:
        for name in ("a", "b"):
            launcher.start(f"scheduler-{name}", app="tests.apps.periodic:app", env=env)

        def slot_jobs() -> list[str]:
            jobs = app.list_jobs(job_type="tick", limit=10_000)
            return [j.message_id or "" for j in jobs]

        wait_for(
            lambda: len(set(slot_jobs())) >= SLOTS + 1,
            timeout=SLOTS / SPEED + 30,
            what=f"{SLOTS + 1} slots enqueued",
        )
        launcher.kill_all()
        message_ids = slot_jobs()
        counts = Counter(message_ids)
        assert all(m.startswith("schedule:tick:") for m in message_ids)
        assert [m for m, n in counts.items() if n > 1] == []
        # The schedule's compare-and-set decided each slot once: the other scheduler never
        # even tried to enqueue it (a second insert would show as a message-id dedup hit).
        ticks = app.list_jobs(job_type="tick", limit=10_000)
        assert [j.id for j in ticks for e in app.trace(j.id) if e.name == "job.deduplicated"] == []
        # No slot is missing between the first and the last (run_all catches up any lag).
        slots = sorted(j.run_at for j in app.list_jobs(job_type="tick", limit=10_000))
        assert len(slots) >= SLOTS
        assert [b - a for a, b in itertools.pairwise(slots)] == [1.0] * (len(slots) - 1)
        status = {s.name: s for s in app.schedule_statuses()}["tick"]
        assert status.last_slot == slots[-1]
        assert status.last_job_id is not None
    finally:
        for key in env:
            os.environ.pop(key, None)
        app.close()
