"""One job, two workers: the first frozen (SIGSTOP) past its lease inside the handler, then resumed.

The frozen worker holds the contract lock ``order:1`` and has created the
shipment; it is stopped before its state write commits. A second worker
reclaims the job, acquires the lock with a higher fencing token, finds the
shipment's idempotency record and marks the order. When the first worker
resumes, its write is rejected by the fencing check and its late settle by the
job's owner-token check.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import replayq
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, read_lines, wait_for
from tests.apps import shop

SHOP = "tests.apps.shop:app"


def test_stalled_worker_resumed_after_takeover_effect_once_and_its_write_fenced(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = shop.build(launcher.url)
    job_id = app.enqueue("ship_order", {"log": str(side_file), "order_id": 1})
    stalled = launcher.start(
        "stalled",
        app=SHOP,
        env={"SHOP_PAUSE_AT": "before_state_commit", "SHOP_PAUSE_SECONDS": "60"},
    )
    wait_for(
        lambda: [x for x in read_lines(side_file) if x["event"] == "pause"],
        timeout=20,
        what="the first worker to hold the lock with its state write pending",
    )
    stalled.signal(signal.SIGSTOP)

    launcher.start("taker", app=SHOP)
    done = wait_for(
        lambda: (job := app.get_job(job_id)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the second worker to reclaim the job and finish it",
    )
    assert done.worker_id == "taker"
    assert done.attempt == 2 and done.redelivery_count == 1

    Path(f"{side_file}.go").touch()  # let the frozen handler run on once it wakes
    stalled.signal(signal.SIGCONT)
    wait_for(
        lambda: [e for e in app.trace(job_id) if e.name == "job.write_rejected"],
        timeout=20,
        what="the resumed worker's late settle to be rejected",
    )

    # Exactly one real effect, by the first attempt; the second found its record.
    effects = [line for line in read_lines(side_file) if line["event"] == "effect"]
    assert [(e["pid"], e["worker"]) for e in effects] == [(stalled.pid, "stalled")]
    events = app.trace(job_id)
    [claimed] = [e for e in events if e.name == "effect.succeeded"]
    assert (claimed.attempt, claimed.worker_id) == (1, "stalled")
    [dedup] = [e for e in events if e.name == "effect.deduplicated"]
    assert (dedup.attempt, dedup.worker_id) == (2, "taker")
    assert dedup.data["first_job"] == job_id and dedup.data["first_attempt"] == 1
    assert done.result == {"shipment": "shp-1", "marked_by": "taker"}

    # Both attempts are in the trace, each by its own worker.
    domain = [e for e in events if e.kind == "domain"]
    assert {(e.attempt, e.worker_id) for e in domain} == {(1, "stalled"), (2, "taker")}
    acquired = [(e.attempt, e.data["fencing_token"]) for e in events if e.name == "lock.acquired"]
    assert acquired == [(1, 1), (2, 2)], "the second holder got a higher fencing token"
    names = [e.name for e in events]
    assert names.index("lease.expired") < names.index("job.redelivered")

    # The resumed worker's state write was fenced off; the state holds the second write.
    [fenced] = [e for e in events if e.name == "state.write_rejected"]
    assert (fenced.attempt, fenced.worker_id, fenced.resource) == (1, "stalled", "order:1")
    assert (fenced.data["fencing_token"], fenced.data["newest_token"]) == (1, 2)
    [late] = [e for e in events if e.name == "job.write_rejected"]
    assert late.worker_id == "stalled"
    [lost_lock] = [e for e in events if e.name == "lock.expired"]
    assert (lost_lock.attempt, lost_lock.worker_id) == (1, "stalled")
    order = app.state.get("order", 1)
    assert (order.version, order.data) == (1, {"status": "shipped", "marked_by": "taker"})
    [version] = app.state.history("order", 1)
    assert (version.job_id, version.attempt, version.fencing_token) == (job_id, 2, 2)

    # ``replayq trace show`` tells the same story to an operator.
    shown = subprocess.run(
        [REPLAYQ, "--db", app.url, "trace", "show", str(job_id)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for needle in (
        "effect.succeeded",
        "effect.deduplicated",
        "state.write_rejected",
        "job.write_rejected",
        "fencing_token=2",
        "(stalled)",
        "(taker)",
    ):
        assert needle in shown, needle

    after = app.get_job(job_id)
    assert after.state is replayq.JobState.SUCCEEDED, "the late failure did not regress the job"
    assert after.result == done.result and after.last_error is None
    assert [e.name for e in app.trace(job_id)].count("job.succeeded") == 1
    app.close()
