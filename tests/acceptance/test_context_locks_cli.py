"""``replayq locks list|break`` against a real worker holding a lease lock."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import replayq
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, read_lines, wait_for
from tests.apps import shop

SHOP = "tests.apps.shop:app"


def cli(url: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [REPLAYQ, "--db", url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def held_locks(url: str) -> list[dict[str, Any]]:
    return list(json.loads(cli(url, "locks", "list", "--json").stdout))


def test_locks_list_shows_the_holder_and_break_frees_it_and_fences_the_old_holder(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = shop.build(launcher.url)
    job_id = app.enqueue("hold_order", {"log": str(side_file), "order_id": 7})
    holder = launcher.start("holder", app=SHOP, env={"SHOP_PAUSE_AT": "holding_lock"})
    wait_for(
        lambda: [x for x in read_lines(side_file) if x["event"] == "pause"],
        timeout=20,
        what="the worker to hold the lock order:7",
    )

    [lock] = held_locks(app.url)
    assert lock["resource"] == "order:7"
    assert lock["worker_id"] == "holder"
    assert lock["job_id"] == job_id
    assert lock["fencing_token"] == 1
    assert lock["owner_token"]
    ttl_left = lock["expires_at"] - time.time()
    assert 0 < ttl_left <= 2.0, "the contract's lock TTL (2 x the 1s lease)"

    text = cli(app.url, "locks", "list").stdout
    [row] = [line for line in text.splitlines() if line.startswith("order:7")]
    resource, token, job, age, left, owner = row.split()
    assert (resource, token, job, owner) == ("order:7", "1", str(job_id), "holder")
    assert age.endswith("s") and 0 < float(left.rstrip("s")) <= 2.0

    # The heartbeat renews the lock while the holder runs: it outlives its first TTL.
    time.sleep(2.3)
    [renewed] = held_locks(app.url)
    assert renewed["owner_token"] == lock["owner_token"]
    assert renewed["expires_at"] > lock["expires_at"]

    refused = cli(app.url, "locks", "break", "order:7", expect=2)
    assert "--reason" in refused.stderr, "breaking a lock needs a reason"
    broke = cli(app.url, "locks", "break", "order:7", "--reason", "holder looks stuck")
    assert broke.stdout.strip() == f"broke lock order:7 (was held by holder, job {job_id})"
    assert held_locks(app.url) == []
    assert "(no locks held)" in cli(app.url, "locks", "list").stdout
    cli(app.url, "locks", "break", "order:7", "--reason", "again", expect=2)

    Path(f"{side_file}.go").touch()  # the old holder now tries its write
    done = wait_for(
        lambda: (job := app.get_job(job_id)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the old holder's write to be fenced and the retry to succeed",
    )
    assert holder.proc.poll() is None, "the same worker process retried the job"
    events = app.trace(job_id)
    [fenced] = [e for e in events if e.name == "state.write_rejected"]
    assert (fenced.attempt, fenced.worker_id) == (1, "holder")
    assert (fenced.data["fencing_token"], fenced.data["newest_token"]) == (1, 2)
    [failed] = [e for e in events if e.name == "job.failed"]
    assert failed.data["error_class"] == "concurrency"
    [broken] = [e for e in app.resource_trace("order:7") if e.name == "lock.broken"]
    assert broken.data == {"reason": "holder looks stuck", "holder": "holder"}
    acquired = [(e.attempt, e.data["fencing_token"]) for e in events if e.name == "lock.acquired"]
    assert acquired == [(1, 1), (2, 3)], "the break itself used token 2"

    assert done.result == {"wrote": 1}
    [version] = app.state.history("order", 7)
    assert version.data == {"adjusted_by_attempt": 2}, "only the retry's write landed"
    assert (version.attempt, version.fencing_token) == (2, 3)
    assert held_locks(app.url) == []
    app.close()
