"""Learning a job type's trace pack dictionary at an attempt's start (storage/
pack_dictionaries.py) is the worker's own optimisation: it must not hold the attempt back
while another process holds the SQLite write lock. A real SQLite file, a real second
connection holding ``BEGIN IMMEDIATE``."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import replayq
from tests.context_support import run_once


def test_an_attempt_starts_without_waiting_for_the_write_lock_its_learning_wants(
    tmp_path: Path,
) -> None:
    """Two jobs of a type succeeded, so the third's start learns the type's dictionary.
    Another process holds the write lock then: the handler (which writes nothing before
    its ack) runs at once, while the lock is still held, not after ``busy_timeout`` (20 s
    here; the other process lets go after 8 s at the latest). Before: the learning's
    ``BEGIN IMMEDIATE`` waited for the lock, and the handler with it. The learning is
    only put off: the next attempt's start, the lock free, learns the dictionary."""
    path = tmp_path / "busy.db"
    app = replayq.App(f"sqlite:///{path}?busy_timeout=20000")
    ran = threading.Event()

    @app.job("ledger.note", retry=replayq.Retry(max_attempts=1))
    def note(ctx: replayq.Context, n: int) -> None:
        if n == 3:
            ran.set()
            return
        with ctx.step("tariff lookup"):
            ctx.call("tariff.lookup", lambda: {"fee_cents": 7, "partner": "acme"})
        with ctx.step("journal entry"):
            ctx.state.put("journal", n, {"fee_cents": 7})

    worker = replayq.Worker(app, worker_id="w1")
    for n in (1, 2):
        app.enqueue("ledger.note", {"n": n})
        run_once(worker)
    third = app.enqueue("ledger.note", {"n": 3})
    leased = worker.lease(1)
    assert [job.id for job in leased] == [third]

    held = threading.Event()
    ran_while_held: list[bool] = []

    def hold_the_write_lock() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            held.set()
            ran_while_held.append(ran.wait(8.0))
            other.execute("ROLLBACK")
        finally:
            other.close()

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    assert held.wait(10.0)
    try:
        worker.execute(leased[0])
    finally:
        holder.join()
    assert ran_while_held == [True]
    assert app.get_job(third).state is replayq.JobState.SUCCEEDED
    assert learned(path) == []  # put off, not waited for
    app.enqueue("ledger.note", {"n": 4})
    run_once(worker)
    assert learned(path) == ["ledger.note"]
    app.close()


def learned(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT job_type FROM rq_pack_dictionaries")]
    finally:
        conn.close()


def test_an_attempt_runs_when_the_trace_its_learning_reads_does_not_decode(
    tmp_path: Path,
) -> None:
    """The learning reads the two succeeded jobs' traces; one of them no longer inflates
    (a damaged row: ``zlib.error``). The learning is given up, logged; the attempt runs
    and succeeds. Before: the error left ``attempt_starts`` before the handler ran, and
    the job stayed ``running`` until its lease ran out and it was reaped."""
    path = tmp_path / "damaged.db"
    app = replayq.App(f"sqlite:///{path}")

    @app.job("ledger.note", retry=replayq.Retry(max_attempts=1))
    def note(ctx: replayq.Context, n: int) -> None:
        with ctx.step("journal entry"):
            ctx.state.put("journal", n, {"fee_cents": 7})

    worker = replayq.Worker(app, worker_id="w1")
    first = app.enqueue("ledger.note", {"n": 1})
    run_once(worker)
    app.enqueue("ledger.note", {"n": 2})
    run_once(worker)
    conn = sqlite3.connect(path)
    try:
        with conn:  # every pack of the first job: a deflate mark, then no deflate stream
            conn.execute(
                "UPDATE rq_trace SET events = ? WHERE job_id = ?", (b"\x02not deflate", first)
            )
    finally:
        conn.close()
    third = app.enqueue("ledger.note", {"n": 3})
    run_once(worker)
    assert app.get_job(third).state is replayq.JobState.SUCCEEDED
    assert app.state.get("journal", 3).exists
    app.close()


def test_a_worker_whose_app_was_closed_learns_on_the_storage_the_app_opens_next(
    tmp_path: Path,
) -> None:
    """``App.close()`` between a worker's runs: the app opens a new storage at its next use,
    and the worker learns the type's dictionary there from two later successes. Before, it
    kept asking the closed storage (looked up once), whose learning failed ("storage is
    closed") for the rest of the worker's life: the type's packs stayed format 2."""
    path = tmp_path / "reopened.db"
    app = replayq.App(f"sqlite:///{path}")

    @app.job("ledger.note", retry=replayq.Retry(max_attempts=1))
    def note(ctx: replayq.Context, n: int) -> None:
        with ctx.step("tariff lookup"):
            ctx.call("tariff.lookup", lambda: {"fee_cents": 7, "partner": "acme"})
        with ctx.step("journal entry"):
            ctx.state.put("journal", n, {"fee_cents": 7})

    worker = replayq.Worker(app, worker_id="w1")
    try:
        app.enqueue("ledger.note", {"n": 0})
        run_once(worker)  # the worker has met the app's first storage
        app.close()
        for n in range(1, 5):
            app.enqueue("ledger.note", {"n": n})
            run_once(worker)
        conn = sqlite3.connect(path)
        try:
            learned = conn.execute("SELECT job_type FROM rq_pack_dictionaries").fetchall()
        finally:
            conn.close()
        assert learned == [("ledger.note",)]
    finally:
        app.close()
