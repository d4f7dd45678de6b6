"""An enqueue on a thread whose SQLite connection is inside ``storage.transaction()``.

Transactions of one storage do not nest, and an enqueue (one statement committed by
itself, ``SqliteStorage.autocommit``) cannot be part of the one that is open: it is
refused with a ``StorageError`` that says so, and the open transaction is left as it
was: what it wrote before and after commits with it, or not at all. Another thread's
enqueue is its own transaction, which waits for the write lock as any other.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

import replayq


def _app(url: str) -> replayq.App:
    app = replayq.App(url)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def _marks(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT name FROM rq_gc WHERE name LIKE 'mark-%' ORDER BY name")
        return [name for (name,) in rows]
    finally:
        conn.close()


def _mark(tx: object, name: str) -> None:
    tx.connection.execute(  # type: ignore[attr-defined]
        "INSERT INTO rq_gc (name, cursor, updated_at) VALUES (?, 1, 0)", (f"mark-{name}",)
    )


@pytest.mark.parametrize("readonly", [False, True], ids=["write", "read"])
def test_an_enqueue_inside_this_threads_transaction_is_refused_and_leaves_it_whole(
    tmp_path: Path, readonly: bool
) -> None:
    db = tmp_path / "q.db"
    app = _app(f"sqlite:///{db}")
    app.enqueue("noop", {"n": 0})
    with app.storage.transaction(readonly=readonly) as tx:
        if not readonly:
            _mark(tx, "before")
        with pytest.raises(replayq.StorageError, match="cannot begin a transaction"):
            app.enqueue("noop", {"n": 1})
        with pytest.raises(replayq.StorageError, match="cannot begin a transaction"):
            app.enqueue_many([replayq.EnqueueRequest("noop", {"n": 2})])
        assert tx.connection.in_transaction, "the open transaction is still open"
        if not readonly:
            _mark(tx, "after")
    assert _marks(db) == ([] if readonly else ["mark-after", "mark-before"])
    assert [j.payload for j in app.list_jobs()] == [{"n": 0}]
    job_id = app.enqueue("noop", {"n": 3})  # the connection is usable once it has ended
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
    app.close()


def test_a_transaction_that_raises_after_a_refused_enqueue_writes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "q.db"
    app = _app(f"sqlite:///{db}")
    app.enqueue("noop", {"n": 0})
    storage = app.storage
    refused = pytest.raises(replayq.StorageError, match="cannot begin a transaction")
    with refused, storage.transaction() as tx:
        _mark(tx, "before")
        app.enqueue("noop", {"n": 1})
    assert _marks(db) == []
    assert len(app.list_jobs()) == 1
    app.close()


def test_another_threads_enqueue_waits_for_the_open_transaction(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    app = _app(f"sqlite:///{db}?busy_timeout=10000")
    app.enqueue("noop", {"n": 0})
    ids: list[int] = []
    with app.storage.transaction() as tx:
        _mark(tx, "held")
        other = threading.Thread(target=lambda: ids.append(app.enqueue("noop", {"n": 1})))
        other.start()
        other.join(0.3)
        assert other.is_alive(), "the enqueue waits for the write lock"
    other.join(10)
    assert len(ids) == 1
    assert [e.name for e in app.trace(ids[0])] == ["job.enqueued"]
    assert _marks(db) == ["mark-held"]
    app.close()


def test_a_transaction_a_failure_left_open_is_ended_by_the_next_one(tmp_path: Path) -> None:
    """A transaction that no ``storage.transaction()`` block holds (left open on the
    connection when a failed ``ROLLBACK`` could not end it; begun here by hand) is not a
    nesting: the next enqueue ends it and goes ahead, instead of every later transaction
    of the thread being refused."""
    db = tmp_path / "q.db"
    app = _app(f"sqlite:///{db}")
    app.enqueue("noop", {"n": 0})
    conn = app.storage._connection()  # type: ignore[attr-defined]
    conn.execute("BEGIN")
    job_id = app.enqueue("noop", {"n": 1})
    assert not conn.in_transaction
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
    assert len(app.list_jobs()) == 2
    app.close()
