"""On SQLite a new job's ``job.enqueued`` pack is written by the insert of its row.

The insert (``job_insert``) builds the pack (format 3) from the values it inserts and keeps
it in the row itself (``rq_jobs.enqueued``, migration 0023; the trigger ``rq_jobs_enqueued``
of 0020 wrote it to ``rq_trace``), so ``App.enqueue`` is one statement committed by itself.
What the trace says of the enqueue must be what the caller asked, to the last bit of
``run_at`` and the last character of a message id.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replayq
from replayq.storage import lifecycle_packs, packs

# What job_insert writes run_at with, and the range enqueue accepts (queue/enqueue.py).
_RUN_AT_TEXT = "SELECT printf('%!.17g', ?)"
_LIMIT = 1e15


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=-_LIMIT, max_value=_LIMIT, exclude_min=True, exclude_max=True))
def test_the_triggers_run_at_text_reads_back_as_the_same_double(run_at: float) -> None:
    conn = sqlite3.connect(":memory:")
    try:
        (text,) = conn.execute(_RUN_AT_TEXT, (run_at,)).fetchone()
    finally:
        conn.close()
    assert float(text) == run_at
    if run_at != 0:  # a REAL column holds -0.0 as 0: the row and the pack agree on 0.0
        assert repr(float(text)) == repr(run_at)


def _app(tmp_path: Path) -> replayq.App:
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}")

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def test_the_enqueued_event_holds_what_the_caller_asked_exactly(tmp_path: Path) -> None:
    app = _app(tmp_path)
    asks: list[dict[str, object]] = [
        {"run_at": 1796398960.6402373, "priority": -3},
        {"run_at": 0.1 + 0.2, "message_id": 'quote " backslash \\ é 𝄞 \u2028 nul-ish \\u0000'},
        {"run_at": 5.0, "priority": 2**31 - 1, "causation_id": "cause-1"},
        {"run_at": -1234.5e-9, "message_id": "m-null", "priority": 7},
        {"run_at": 1e14 + 0.5},
    ]
    ids = [app.enqueue("noop", {"n": n}, **ask) for n, ask in enumerate(asks)]  # type: ignore[arg-type]
    traced = [app.trace(job_id) for job_id in ids]
    app.close()
    for ask, events in zip(asks, traced, strict=True):
        [event] = events
        assert (event.name, event.kind, event.status, event.attempt) == (
            "job.enqueued",
            "lifecycle",
            "queued",
            0,
        )
        expected = {
            "run_at": ask["run_at"],
            "priority": ask.get("priority", 0),
            "message_id": ask.get("message_id"),
            "ordering_key": None,
            "causation_id": ask.get("causation_id"),
        }
        assert event.data == expected
        assert repr(event.data["run_at"]) == repr(ask["run_at"])


def test_the_rows_pack_is_the_one_replayq_would_encode(tmp_path: Path) -> None:
    """Format 3 as job_insert writes it in the row and as ``lifecycle_packs.lifecycle_pack`` encodes
    the same event decode to the same JSON: readers cannot tell who wrote it. No pack of
    it is in rq_trace."""
    app = _app(tmp_path)
    job_id = app.enqueue("noop", {"n": 1}, message_id="m1", run_at=1796398960.25, priority=4)
    [event] = app.trace(job_id)
    app.close()
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        (stored, hlc) = conn.execute(
            "SELECT enqueued, enqueued_hlc FROM rq_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        (in_trace,) = conn.execute(
            "SELECT COUNT(*) FROM rq_trace WHERE job_id = ?", (job_id,)
        ).fetchone()
    finally:
        conn.close()
    encoded = lifecycle_packs.lifecycle_pack(event)
    assert encoded is not None
    assert stored[:1] == encoded[:1] == b"\x03"
    assert packs.pack_json(stored) == packs.pack_json(bytes(encoded))
    assert (hlc, event.id, in_trace) == (event.hlc, -job_id * 1024, 0)


def test_a_duplicate_message_id_writes_no_second_enqueued_pack(tmp_path: Path) -> None:
    app = _app(tmp_path)
    first = app.enqueue("noop", {"n": 1}, message_id="once")
    again = app.enqueue("noop", {"n": 2}, message_id="once")
    names = [e.name for e in app.trace(first)]
    app.close()
    assert again == first
    assert names == ["job.enqueued", "job.deduplicated"]


def test_an_enqueue_is_one_statement_committed_by_itself(tmp_path: Path) -> None:
    """No BEGIN, no COMMIT, no second insert: the row's statement is the whole enqueue."""
    app = _app(tmp_path)
    app.enqueue("noop", {"n": 0})  # the schema and the connection exist
    conn = app.storage._connection()  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        job_id = app.enqueue("noop", {"n": 1})
    finally:
        conn.set_trace_callback(None)
    assert not conn.in_transaction
    # SQLite would trace the statement again as it entered a trigger: every line is the insert.
    assert statements and all(s.startswith("INSERT INTO rq_jobs ") for s in statements), statements
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
    app.close()


def _deleted_when(app: replayq.App, job_id: int, statement: str) -> list[str]:
    """Delete job ``job_id`` from another connection (as gc does a finished job) once the
    app's connection starts a statement beginning with ``statement``; returns the
    statements the app's connection ran, for the test to take the callback off."""
    db = app.storage.path  # type: ignore[attr-defined]
    other = sqlite3.connect(db, isolation_level=None, timeout=0)
    seen: list[str] = []

    def meddle(sql: str) -> None:
        seen.append(sql)
        if sql.startswith(statement) and other is not None and len(seen) < 100:
            try:
                other.execute("DELETE FROM rq_jobs WHERE id = ?", (job_id,))
                seen.append("deleted")
            except sqlite3.OperationalError:  # the write lock is held: nothing deleted
                seen.append("locked")
            other.close()

    app.storage._connection().set_trace_callback(meddle)  # type: ignore[attr-defined]
    return seen


@pytest.mark.parametrize(
    "between",
    [
        "SELECT id FROM rq_jobs WHERE job_type",  # the insert met the row; its id is read
        "BEGIN IMMEDIATE",  # the job.deduplicated's own transaction
    ],
)
def test_a_duplicate_whose_job_is_deleted_meanwhile_is_enqueued_anew(
    tmp_path: Path, between: str
) -> None:
    """An enqueue is one statement committed by itself: the job a duplicate message id
    met can be deleted (gc of a finished job) before the next statement reads it. The
    message id is free then: the enqueue makes a new job, with its job.enqueued, instead
    of failing on a job that is gone (a TypeError or an AssertionError)."""
    app = _app(tmp_path)
    first = app.enqueue("noop", {"n": 1}, message_id="m")
    seen = _deleted_when(app, first, between)
    try:
        again = app.enqueue("noop", {"n": 2}, message_id="m")
    finally:
        app.storage._connection().set_trace_callback(None)  # type: ignore[attr-defined]
    if "locked" in seen:  # a transaction held the write lock: the duplicate met the job
        assert again == first
        assert [e.name for e in app.trace(first)] == ["job.enqueued", "job.deduplicated"]
    else:
        assert "deleted" in seen, seen
        job = app.get_job(again)
        assert (job.message_id, job.payload) == ("m", {"n": 2})
        assert [e.name for e in app.trace(again)] == ["job.enqueued"]
        assert [j.id for j in app.list_jobs()] == [again]
    app.close()
