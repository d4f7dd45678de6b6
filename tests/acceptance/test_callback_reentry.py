"""A ``ctx`` call inside a ``ctx.db_write`` function fails its job at once on a real
worker, which goes on with its other jobs; before, the worker's slot hung for good.

``reenter`` and ``reenter_async`` (``tests/apps/callback_reentry.py``) call ``ctx.call``,
``ctx.effect`` or ``ctx.step`` from inside the function that ``ctx.db_write`` runs at the
commit of their step. Before, that call waited forever for the context's ``_live``, held
by the very commit it ran in: the job stayed ``running`` (on PostgreSQL the heartbeat kept
extending its lease, so it was never even reaped; on SQLite the commit kept the
database's write lock, and every other writer — the worker's own heartbeat and leases,
an ``enqueue`` from the CLI — got ``database is locked``); an ``async def`` one froze the
worker's event loop, every async job on it with it, and SIGTERM no longer stopped the
worker. Now each such job is ``dead`` (class ``validation``) after one attempt with
``CallbackReentryError`` naming the call, its row rolled back, and the burst worker runs
the jobs behind them and exits. ``reenter_at_ack`` makes its call from a function that
runs in the worker's group commit of acks (outside steps): it never hung (the context has
ended by then), and is refused the same way, naming the call.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli
from tests.apps import callback_reentry

APP = "tests.apps.callback_reentry:app"

# A hung worker must fail the test, well before pytest's own timeout.
pytestmark = pytest.mark.timeout(180)


def test_a_ctx_call_inside_a_db_write_function_fails_its_job_and_the_worker_goes_on(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    side = tmp_path / "runs.jsonl"
    app = callback_reentry.build(launcher.url)
    try:
        callback_reentry.create_table(app)
        refused = {
            app.enqueue("reenter", {"order": 1, "verb": "call"}): "ctx.call('price')",
            app.enqueue("reenter", {"order": 2, "verb": "step"}): "ctx.step('inner')",
            app.enqueue("reenter_async", {"order": 3, "verb": "effect"}): "ctx.effect('mail.send')",
            app.enqueue("reenter_async", {"order": 4, "verb": "call"}): "ctx.call('price')",
            app.enqueue(
                "reenter_at_ack", {"order": 5, "verb": "effect"}
            ): "ctx.effect('mail.send')",
        }
        behind = [
            app.enqueue("deliver", {"order": 10}),
            app.enqueue("deliver_async", {"order": 11}),
        ]

        worker = launcher.start(
            "w1",
            app=APP,
            concurrency=2,
            burst=True,
            env={"CALLBACK_REENTRY_SIDE_FILE": str(side)},
        )
        # A hung slot never lets a burst worker exit.
        assert worker.wait(120) == 0, worker.log()

        for job_id, verb in refused.items():
            job = app.get_job(job_id)
            assert job.state is replayq.JobState.DEAD, (job_id, job.state, job.last_error)
            assert (job.last_error_class, job.dead_reason) == ("validation", "not_retryable")
            assert job.attempt == 1
            assert (job.last_error or "").startswith(
                f"CallbackReentryError: {verb} inside a ctx.db_write function"
            ), job.last_error
        assert [app.get_job(job_id).state for job_id in behind] == [
            replayq.JobState.SUCCEEDED,
            replayq.JobState.SUCCEEDED,
        ]
        # Each refused job ran once; the rows of their refused commits rolled back.
        runs = Counter(line["order"] for line in read_lines(side))
        assert runs == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 10: 1, 11: 1}, runs
        assert callback_reentry.delivered(app) == [10, 11]

        # What an operator reads: the step rolled back, and why.
        shown = run_cli(launcher.url, "trace", "show", str(next(iter(refused))))
        assert shown.returncode == 0, shown.stderr
        assert "step.rolled_back" in shown.stdout
        assert "CallbackReentryError: ctx.call('price') inside" in shown.stdout
    finally:
        app.close()
