"""A ``ctx.db_write`` function that raises fails its own attempt, classified, on a real
worker, wherever it runs — at the job's ack in a group commit, at an ack made alone, at
a step's commit (a plain and an ``async def`` handler) — and the worker goes on.

The functions (``tests/apps/db_write_raises.py``) insert their order into the
application's ``shipments`` table and then raise ``ZeroDivisionError`` (mapped to
``transient`` by the contract: retried once, then ``dead``), ``KeyboardInterrupt`` or
``SystemExit`` (no class mapped: ``dead`` after one attempt). Each such job ends with
its error in ``last_error``, its row and its state write rolled back; the jobs beside
it succeed once.

Before, an ack made alone (a routed type's) let the function's error out of the worker's
settle: the executor logged "could not be settled", the job stayed ``running`` until its
lease was reaped, and it ran again. ``KeyboardInterrupt`` and ``SystemExit`` escaped every
``except Exception`` of the worker: out of a step's commit or an ack alone they ended the
executor thread (the jobs queued behind it never ran), out of a group commit they ended
the thread that committed it with every ack of the group held, and out of an
``async def`` handler's step they ended the worker's event loop (every async job after
it waited for good).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli, wait_for
from tests.apps import db_write_raises

APP = "tests.apps.db_write_raises:app"
# A worker left without an executor or an event loop must fail the test, not hang it.
pytestmark = pytest.mark.timeout(180)
# Longer than a lease (2 s) and the reaper's look after it: a job left running would be
# reaped and run again within it.
QUIET = 5.0
# Each order's ``raises``; orders 1 and 5 succeed, around the three that raise.
RAISES: dict[int, str | None] = {1: None, 2: "zero", 3: "interrupt", 4: "exit", 5: None}
GOOD = [order for order, raises in RAISES.items() if raises is None]
ERROR_NAMES = {"zero": "ZeroDivisionError", "interrupt": "KeyboardInterrupt", "exit": "SystemExit"}


def _run(
    launcher: WorkerLauncher, tmp_path: Path, job_types: dict[str, int]
) -> tuple[str, dict[tuple[str, int], int]]:
    """Enqueue ``RAISES``' orders for each type (its orders offset by ``job_types[type]``),
    run one worker until they settle, check each job's end; the worker's log and the job
    ids by type and order."""
    side = tmp_path / "runs.jsonl"
    app = db_write_raises.build(launcher.url)
    try:
        db_write_raises.create_table(app)
        if "ship" in job_types:
            # Every job stays on v1; the type has routing, so each success is acked alone.
            app.rollout("ship", actor="test").start("v2", canary="0%", reason="acked alone")
        ids = {
            (job_type, offset + order): app.enqueue(
                job_type, {"order": offset + order, "raises": raises}
            )
            for job_type, offset in job_types.items()
            for order, raises in RAISES.items()
        }
        # One executor, every job leased in one batch, acks held up to 5 s: the acks of a
        # grouped type are one group, committed once the executor has nothing left.
        worker = launcher.start(
            "w1",
            app=APP,
            env={"DB_WRITE_RAISES_SIDE_FILE": str(side)},
            options=("--prefetch", "16", "--prefetch-window", "inf", "--ack-window", "5"),
        )

        def settled() -> bool:
            return all(
                app.get_job(job_id).state in (replayq.JobState.SUCCEEDED, replayq.JobState.DEAD)
                for job_id in ids.values()
            )

        wait_for(settled, timeout=60, what="every job to settle")
        time.sleep(QUIET)

        runs = Counter(line["order"] for line in read_lines(side))
        expected_runs = {order: 2 if RAISES[order % 10] == "zero" else 1 for _, order in ids}
        assert runs == expected_runs, runs  # no job reaped and run again
        for (_, order), job_id in ids.items():
            job = app.get_job(job_id)
            raises = RAISES[order % 10]
            if raises is None:
                assert (job.state, job.last_error) == (replayq.JobState.SUCCEEDED, None)
                assert app.state.get("order", order).data == {"shipped": True}
                continue
            assert job.state is replayq.JobState.DEAD, (order, job.state, job.last_error)
            # The function's own error, its message whole.
            error = f"{ERROR_NAMES[raises]}: {db_write_raises.message(order)}"
            assert job.last_error == error, (order, job.last_error)
            if raises == "zero":  # the contract maps it: retried once
                assert (job.last_error_class, job.dead_reason) == (
                    "transient",
                    "attempts_exhausted",
                )
                assert job.attempt == 2
            else:
                assert (job.last_error_class, job.dead_reason) == ("unknown", "not_retryable")
                assert job.attempt == 1
            # Nothing of the commit it spoiled landed: its state write neither.
            assert app.state.get("order", order).version == 0, order
            names = [e.name for e in app.trace(job_id)]
            assert "job.failed" in names and "write.rejected" not in names, names
        orders = sorted(order for _, order in ids if RAISES[order % 10] is None)
        assert db_write_raises.shipped(app) == orders

        assert worker.proc.poll() is None, worker.log()  # the worker runs on
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
        return worker.log(), ids
    finally:
        app.close()


def test_a_db_write_function_raising_at_a_group_commit_fails_its_job_and_acks_the_others(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    log, _ = _run(launcher, tmp_path, {"pack": 0})
    # The acks were one group, split to leave out the ones that raised.
    assert "committed in halves" in log, log


def test_a_db_write_function_raising_at_an_ack_made_alone_fails_its_job(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    log, _ = _run(launcher, tmp_path, {"ship": 0})
    assert "committed in halves" not in log, log
    assert "could not be settled" not in log, log


def test_a_db_write_function_raising_at_a_step_commit_fails_its_job(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    _, ids = _run(launcher, tmp_path, {"wrap": 0, "wrap_async": 10})
    # What an operator reads: the step rolled back, and why.
    shown = run_cli(launcher.url, "trace", "show", str(ids["wrap_async", 13]))
    assert shown.returncode == 0, shown.stderr
    assert "step.rolled_back" in shown.stdout
    assert f"KeyboardInterrupt: {db_write_raises.message(13)}" in shown.stdout
