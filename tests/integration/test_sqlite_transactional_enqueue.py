"""Transactional enqueue on SQLite: the job exists only if the caller's own transaction commits."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "shop.db"


@pytest.fixture
def app(db_path: Path) -> Iterator[replayq.App]:
    app = replayq.App(f"sqlite:///{db_path}")

    @app.job("send_receipt")
    def send_receipt(ctx: replayq.Context, order_id: int) -> None: ...

    app.list_jobs()  # create and migrate the file before the business schema goes in
    yield app
    app.close()


@pytest.fixture
def business(db_path: Path, app: replayq.App) -> Iterator[sqlite3.Connection]:
    """The application's own connection to the same file, in autocommit until it says BEGIN."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
    yield conn
    conn.close()


def orders(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    return conn.execute("SELECT id, status FROM orders").fetchall()


def test_rolled_back_transaction_leaves_neither_the_job_nor_the_business_row(
    app: replayq.App, business: sqlite3.Connection
) -> None:
    business.execute("BEGIN")
    business.execute("INSERT INTO orders VALUES (1, 'paid')")
    job_id = app.enqueue("send_receipt", {"order_id": 1}, conn=business)
    business.execute("ROLLBACK")

    assert orders(business) == []
    assert app.list_jobs() == []
    assert app.trace(job_id) == [], "no trace event survives the rollback either"
    assert replayq.Worker(app, burst=True).run().leased == 0


def test_committed_transaction_makes_both_the_job_and_the_business_row(
    app: replayq.App, business: sqlite3.Connection
) -> None:
    business.execute("BEGIN")
    business.execute("INSERT INTO orders VALUES (1, 'paid')")
    job_id = app.enqueue("send_receipt", {"order_id": 1}, conn=business, message_id="order-1")
    [bulk_id] = app.enqueue_many(
        [replayq.EnqueueRequest("send_receipt", {"order_id": 2})], conn=business
    )
    business.execute("COMMIT")

    assert orders(business) == [(1, "paid")]
    assert {job.id for job in app.list_jobs()} == {job_id, bulk_id}
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
    assert replayq.Worker(app, burst=True).run().succeeded == 2


def test_transactional_enqueue_needs_an_open_transaction(
    app: replayq.App, business: sqlite3.Connection
) -> None:
    with pytest.raises(replayq.ConfigurationError, match="open transaction"):
        app.enqueue("send_receipt", {"order_id": 1}, conn=business)
    with pytest.raises(replayq.ConfigurationError, match=r"sqlite3\.Connection"):
        app.enqueue("send_receipt", {"order_id": 1}, conn=object())
    assert app.list_jobs() == []


def test_rejected_payload_inside_the_callers_transaction_leaves_it_usable(
    app: replayq.App, business: sqlite3.Connection
) -> None:
    business.execute("BEGIN")
    business.execute("INSERT INTO orders VALUES (1, 'paid')")
    with pytest.raises(replayq.PayloadError, match="'order_id'"):
        app.enqueue("send_receipt", {"order": 1}, conn=business)
    business.execute("COMMIT")
    assert orders(business) == [(1, "paid")]
    assert app.list_jobs() == []


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_connection_in_the_drivers_default_mode_enqueues_in_its_implicit_transaction(
    app: replayq.App, db_path: Path, business: sqlite3.Connection, commit: bool
) -> None:
    """``sqlite3.connect``'s default mode opens a transaction at the first write: the job's
    row goes in it, and its one ``job.enqueued`` pack (the trigger ``rq_jobs_enqueued``)
    with it; a duplicate message id in the same transaction writes a
    ``job.deduplicated``, no second ``job.enqueued``."""
    conn = sqlite3.connect(db_path)  # isolation_level "": implicit BEGIN before a write
    try:
        conn.execute("INSERT INTO orders VALUES (1, 'paid')")
        job_id = app.enqueue("send_receipt", {"order_id": 1}, conn=conn, message_id="o-1")
        again = app.enqueue("send_receipt", {"order_id": 1}, conn=conn, message_id="o-1")
        assert conn.in_transaction
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    assert again == job_id
    if commit:
        assert [job.id for job in app.list_jobs()] == [job_id]
        assert [e.name for e in app.trace(job_id)] == ["job.enqueued", "job.deduplicated"]
    else:
        assert app.list_jobs() == [] and app.trace(job_id) == []
        assert orders(business) == []
