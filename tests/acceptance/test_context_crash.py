"""A worker killed (SIGKILL) around a step's commit: what committed stays, what did not never was.

After the kill the outbox is published by the ``replayq outbox run --once``
command, and a fresh worker finishes the reclaimed job: each event is
published and consumed once, and the confirmation email goes out once.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import replayq
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, read_lines, wait_for
from tests.apps import shop
from tests.context_support import count_rows, named

SHOP = "tests.apps.shop:app"


def outbox_run_once(url: str) -> str:
    """``replayq outbox run --once`` as an operator runs it; returns what it printed."""
    done = subprocess.run(
        [REPLAYQ, "--db", url, "outbox", "run", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def kill_at(launcher: WorkerLauncher, side_file: Path, point: str) -> None:
    """Start a worker that pauses at ``point`` on attempt 1, and SIGKILL it there."""
    doomed = launcher.start("doomed", app=SHOP, env={"SHOP_PAUSE_AT": point})
    wait_for(
        lambda: [x for x in read_lines(side_file) if x["event"] == "pause"],
        timeout=20,
        what=f"the worker to reach {point}",
    )
    doomed.signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL


def finish_with_a_fresh_worker(launcher: WorkerLauncher, app: replayq.App, job_id: int) -> None:
    """Once the dead worker's lease has run out, a burst worker reclaims and finishes the job."""
    deadline = app.get_job(job_id).lease_deadline
    assert deadline is not None
    time.sleep(max(0.0, deadline - time.time()) + 0.05)
    survivor = launcher.start("survivor", app=SHOP, burst=True)
    assert survivor.wait(60) == 0, survivor.log()
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED, survivor.log()
    assert (job.attempt, job.worker_id, job.redelivery_count) == (2, "survivor", 1)


def test_crash_after_the_step_committed_the_event_is_published_exactly_once(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = shop.build(launcher.url)
    job_id = app.enqueue("place_order", {"log": str(side_file), "order_id": 1})
    kill_at(launcher, side_file, "after_step_commit")

    # The step committed before the crash: its state and outbox row are there, unpublished.
    assert app.state.get("order", 1).data == {"status": "placed"}
    assert count_rows(app.url, "rq_outbox", "published_at IS NULL") == 1
    assert count_rows(app.url, "rq_idempotency") == 0, "the email step had not started"

    assert outbox_run_once(app.url) == "published=1 failed=0"
    assert outbox_run_once(app.url) == "", "a second run finds nothing to publish"
    [consumer] = app.list_jobs(job_type="order.placed")
    [written] = named(app, job_id, "outbox.written")
    assert consumer.message_id == f"outbox:{written.data['event_id']}"

    finish_with_a_fresh_worker(launcher, app, job_id)
    [again] = named(app, job_id, "decision")[1:]
    assert (again.attempt, again.data["value"]) == (2, True), "the retry saw the committed step"
    assert outbox_run_once(app.url) == ""
    assert count_rows(app.url, "rq_outbox") == 1, "the reclaimed attempt wrote no second row"
    assert len(app.list_jobs(job_type="order.placed")) == 1
    lines = read_lines(side_file)
    assert [x["n"] for x in lines if x["event"] == "consumed"] == [1], "consumed exactly once"
    assert [x["n"] for x in lines if x["event"] == "effect"] == [1], "one confirmation email"
    [published] = [
        e for e in app.resource_trace("outbox:order.placed") if e.name == "outbox.published"
    ]
    assert published.data["event_id"] == written.data["event_id"]
    assert published.data["lag"] > 0
    app.close()


def test_crash_before_the_step_committed_leaves_no_trace_of_the_step(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = shop.build(launcher.url)
    job_id = app.enqueue("place_order", {"log": str(side_file), "order_id": 2})
    kill_at(launcher, side_file, "before_step_commit")

    assert app.state.get("order", 2).version == 0, "no state change"
    assert app.state.history("order", 2) == []
    assert count_rows(app.url, "rq_outbox") == 0, "no outbox row"
    assert count_rows(app.url, "rq_idempotency") == 0, "no effect record"
    names = [e.name for e in app.trace(job_id)]
    # 'load' wrote nothing, so it did not commit: its events waited for the next commit,
    # which the crash prevented (docs/recording-context.md, "What a crash can lose").
    assert "job.leased" in names and "state.read" not in names
    assert "outbox.written" not in names and "state.write" not in names
    assert outbox_run_once(app.url) == ""

    # Nothing was lost either: the reclaimed job does the step once, from scratch.
    finish_with_a_fresh_worker(launcher, app, job_id)
    assert app.state.get("order", 2).data == {"status": "placed"}
    assert [v.attempt for v in app.state.history("order", 2)] == [2]
    assert outbox_run_once(app.url) == "published=1 failed=0"
    assert count_rows(app.url, "rq_outbox") == 1
    lines = read_lines(side_file)
    assert [x["n"] for x in lines if x["event"] == "effect"] == [2]
    app.close()
