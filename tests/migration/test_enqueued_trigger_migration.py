"""Migration 0020: the insert of a job's row writes its ``job.enqueued`` pack (the trigger
``rq_jobs_enqueued``). A file built by the migrations before it, holding a job whose pack
replayq wrote then (format 3, in Python), is upgraded by opening it: that job keeps its
one ``job.enqueued``, and a job enqueued afterwards gets exactly one (in its row since
migration 0023, which dropped the trigger).
Nothing the upgrade does to ``rq_jobs`` writes a pack."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
from replayq.model import TraceEvent
from replayq.storage import packs
from tests.migration.older import migrated_before

TRACE = "0123456789abcdef0123456789abcdef"


def old_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        migrated_before(conn, 20)
        conn.execute(
            "INSERT INTO rq_jobs (id, job_type, queue, payload, state, priority, run_at,"
            " created_at, max_attempts, trace_id, message_id, hlc) VALUES"
            " (1, 'noop', 'default', '{\"n\": 0}', 'queued', 2, 10.5, 10.0, 3, ?, 'm0', 7)",
            (TRACE,),
        )
        enqueued = TraceEvent(
            trace_id=TRACE, job_id=1, attempt=0, name="job.enqueued", kind="lifecycle",
            status="queued", ts=10.0, hlc=7,
            data={"run_at": 10.5, "priority": 2, "message_id": "m0", "ordering_key": None,
                  "causation_id": None},
        )  # fmt: skip
        row = packs.pack_row([enqueued], packs.FORMAT_DEFLATE)
        assert bytes(row["events"][:1]) == b"\x03"
        conn.execute(
            "INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts,"
            " events) VALUES (:trace_id, :job_id, :attempt, :worker_id, :hlc, :hlc_last, :ts,"
            " :events)",
            {**row, "events": bytes(row["events"])},
        )
    conn.close()


def test_a_file_from_before_0020_keeps_one_enqueued_event_a_job(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_database(path)
    app = replayq.App(f"sqlite:///{path}", auto_migrate=True)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    try:
        new = app.enqueue("noop", {"n": 1}, run_at=20.25, priority=-1, message_id="m1")
        old_trace, new_trace = app.trace(1), app.trace(new)
        with app.storage.transaction(readonly=True) as tx:
            (packs_stored,) = tx.connection.execute("SELECT COUNT(*) FROM rq_trace").fetchone()
            (packs_read,) = tx.connection.execute("SELECT COUNT(*) FROM rq_packs").fetchone()
    finally:
        app.close()
    assert new == 2
    # The old job's pack stays in rq_trace; the new job's is in its row (migration 0023).
    assert (packs_stored, packs_read) == (1, 2)
    assert [(e.name, e.data) for e in old_trace] == [
        (
            "job.enqueued",
            {"run_at": 10.5, "priority": 2, "message_id": "m0", "ordering_key": None,
             "causation_id": None},
        )
    ]  # fmt: skip
    assert [(e.name, e.data) for e in new_trace] == [
        (
            "job.enqueued",
            {"run_at": 20.25, "priority": -1, "message_id": "m1", "ordering_key": None,
             "causation_id": None},
        )
    ]  # fmt: skip
