"""An attempt the queue's own database failed is put back, not failed — and never in a loop.

The handler takes SQLite's write lock on its own connection, then commits a step
through ``ctx``: the step's commit waits ``busy_timeout`` (100 ms here) and meets
``database is locked``, a real lock on a real file. The handler's ``finally`` lets
the lock go, so the worker's put-back commits. Each attempt deadlocks the same way:
after ``STORAGE_FAULT_RELEASES`` put-backs the next one fails like any other
(class ``dependency``), and with one attempt in its contract the job is dead.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
from replayq.worker import Worker
from replayq.worker.outcome import STORAGE_FAULT_RELEASES


def test_a_job_that_keeps_meeting_the_database_fault_fails_after_a_bounded_number_of_put_backs(
    tmp_path: Path,
) -> None:
    database = tmp_path / "queue.db"
    app = replayq.App(f"sqlite:///{database}?busy_timeout=100")

    @app.job("selfish", retry=replayq.Retry(max_attempts=1))
    def selfish(ctx: replayq.Context, n: int) -> None:
        own = sqlite3.connect(database, isolation_level=None, timeout=10)
        try:
            own.execute("BEGIN IMMEDIATE")  # the handler's own write lock on the queue's file
            with ctx.step("write"):
                ctx.state.put("thing", str(n), {"n": n})
        finally:
            own.close()  # rolls back: the lock is gone before the worker settles

    job_id = app.enqueue("selfish", {"n": 1})
    stats = Worker(app, burst=True, poll_interval=0.01).run()

    job = app.get_job(job_id)
    events = app.trace(job_id)
    put_back = [e for e in events if e.name == "lease.released"]
    failed = [e for e in events if e.name == "job.failed"]
    assert len(put_back) == STORAGE_FAULT_RELEASES
    assert all("database is locked" in e.data["storage_fault"] for e in put_back)
    assert [e.data["error_class"] for e in failed] == ["dependency"]
    assert job.state == replayq.JobState.DEAD
    assert stats.released == STORAGE_FAULT_RELEASES and stats.dead == 1
    app.close()


def test_a_brief_lock_on_a_step_commit_puts_the_job_back_and_it_resumes_after_its_steps(
    tmp_path: Path,
) -> None:
    database = tmp_path / "queue.db"
    app = replayq.App(f"sqlite:///{database}?busy_timeout=100")
    attempts: list[int] = []

    def first(ctx: replayq.Context, n: int) -> int:
        ctx.state.put("thing", "first", {"n": n})
        return n * 2

    def second(ctx: replayq.Context, doubled: int) -> int:
        ctx.state.put("thing", "second", {"doubled": doubled})
        return doubled + 1

    @app.job("once_locked", retry=replayq.Retry(max_attempts=1))
    def once_locked(ctx: replayq.Context, n: int) -> int:
        doubled: int = ctx.step("first", first, ctx, n)
        attempts.append(ctx.attempt)
        own = sqlite3.connect(database, isolation_level=None, timeout=10)
        try:
            if len(attempts) == 1:  # only the first attempt meets the lock
                own.execute("BEGIN IMMEDIATE")
            result: int = ctx.step("second", second, ctx, doubled)
        finally:
            own.close()
        return result

    job_id = app.enqueue("once_locked", {"n": 7})
    Worker(app, burst=True, poll_interval=0.01).run()

    job = app.get_job(job_id)
    events = app.trace(job_id)
    names = [e.name for e in events]
    assert job.state == replayq.JobState.SUCCEEDED and job.result == 15
    assert names.count("lease.released") == 1 and "job.failed" not in names
    assert job.attempt == 2 and attempts == [1, 2]
    # The step the first attempt committed is not run again: the second attempt skips it.
    skipped = [(e.attempt, e.data["step_name"]) for e in events if e.name == "step.skipped"]
    assert skipped == [(2, "first")]
    with app.storage.transaction(readonly=True) as tx:
        versions = tx.connection.execute(
            "SELECT key, version FROM rq_entities WHERE namespace = 'thing' ORDER BY key"
        ).fetchall()
    assert [tuple(v) for v in versions] == [("first", 1), ("second", 1)]
    app.close()
