"""``trace resource`` orders what two worker processes did to one entity (hybrid logical clock)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import replayq
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, wait_for
from tests.apps import shop

SHOP = "tests.apps.shop:app"
JOBS = 4
CYCLE = ["lock.acquired", "state.read", "state.write", "lock.released"]


def cli(url: str, *args: str) -> str:
    done = subprocess.run(
        [REPLAYQ, "--db", url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_trace_resource_orders_two_workers_lock_read_write_release_per_job(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = shop.build(launcher.url)
    app.state.put("order", 1, {"touches": 0}, expected_version=0)
    # The first holder keeps the lock long enough for the other process to start and queue up.
    holds = [1.5] + [0.2] * (JOBS - 1)
    jobs = [
        app.enqueue("touch_order", {"log": str(side_file), "order_id": 1, "hold": hold})
        for hold in holds
    ]
    launcher.start("w-a", app=SHOP)
    launcher.start("w-b", app=SHOP)
    wait_for(
        lambda: all(app.get_job(j).state is replayq.JobState.SUCCEEDED for j in jobs),
        timeout=60,
        what="both workers to finish every touch of order 1",
    )

    events = app.resource_trace("order:1")
    assert [e.name for e in events] == CYCLE * JOBS, "each holder: lock, read, write, release"
    hlcs = [e.hlc for e in events]
    assert hlcs == sorted(hlcs) and len(set(hlcs)) == len(hlcs)
    holders = []
    for n, cycle in enumerate(zip(*[iter(events)] * len(CYCLE), strict=True)):
        acquired, read, write, released = cycle
        assert len({e.job_id for e in cycle}) == 1, "one job per cycle: the lock excludes others"
        assert len({e.worker_id for e in cycle}) == 1
        assert acquired.data["fencing_token"] == released.data["fencing_token"] == n + 1
        assert read.resource_version == n + 1, f"cycle {n} reads what cycle {n - 1} wrote"
        assert write.resource_version == n + 2
        assert write.data["parent_version"] == n + 1
        assert write.data["fencing"] == {"order:1": n + 1}
        holders.append(acquired.worker_id)
    assert set(holders) == {"w-a", "w-b"}, f"both workers took part: {holders}"
    assert app.state.get("order", 1).data == {"touches": JOBS}
    assert sorted(app.get_job(j).result["read"] for j in jobs) == list(range(1, JOBS + 1))

    # The CLI shows the same order, one line per event, naming job and worker.
    lines = [line for line in cli(app.url, "trace", "resource", "order:1").splitlines() if line]
    assert len(lines) == len(events)
    for line, event in zip(lines, events, strict=True):
        assert event.name in line
        assert f"job {event.job_id}" in line
        assert f"({event.worker_id})" in line
        if event.name.startswith("state."):
            assert f"order:1@v{event.resource_version}" in line
    history = cli(app.url, "state", "history", "order", "1").splitlines()
    assert [line.split()[0] for line in history] == [f"v{n}" for n in range(1, JOBS + 2)]
    writes = events[2 :: len(CYCLE)]
    for line, write in zip(history[1:], writes, strict=True):
        assert f"parent={write.resource_version - 1}" in line
        assert f"by=job {write.job_id} attempt {write.attempt}" in line
    as_json: list[dict[str, Any]] = json.loads(
        cli(app.url, "trace", "resource", "order:1", "--json")
    )
    assert [(e["name"], e["job_id"], e["hlc"]) for e in as_json] == [
        (e.name, e.job_id, e.hlc) for e in events
    ]
    app.close()
