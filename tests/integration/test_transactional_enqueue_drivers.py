"""Transactional enqueue on the caller's connection, whatever its row factory, sync or async.

The caller's connection is theirs: replayq neither changes its row factory nor needs a
particular one. A job enqueued on it exists only when the caller commits.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, namedtuple_row

import replayq


def declare(app: replayq.App) -> replayq.App:
    @app.job("send_receipt")
    def send_receipt(ctx: replayq.Context, order_id: int) -> int:
        return order_id

    return app


@pytest.fixture
def pg_app(pg_schema_url: str) -> Iterator[replayq.App]:
    app = declare(replayq.App(pg_schema_url, auto_migrate=True))
    app.list_jobs()  # migrate before the caller's connections arrive
    yield app
    app.close()


def run_all(app: replayq.App) -> replayq.Worker:
    worker = replayq.Worker(app, burst=True, poll_interval=0.01)
    worker.run()
    return worker


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row], ids=["dict", "namedtuple"])
def test_a_psycopg_connection_with_any_row_factory_enqueues_and_keeps_its_factory(
    pg_app: replayq.App, pg_schema_url: str, row_factory: Callable[..., Any]
) -> None:
    with psycopg.connect(pg_schema_url, row_factory=row_factory) as conn:
        job_id = pg_app.enqueue("send_receipt", {"order_id": 7}, conn=conn, message_id="o-7")
        again = pg_app.enqueue("send_receipt", {"order_id": 7}, conn=conn, message_id="o-7")
        assert again == job_id, "dedup reads the existing id through the same factory"
        assert conn.row_factory is row_factory
        conn.commit()
    assert run_all(pg_app).stats.succeeded == 1
    assert pg_app.get_job(job_id).result == 7


def test_a_rolled_back_dict_row_transaction_leaves_no_job(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    with psycopg.connect(pg_schema_url, row_factory=dict_row) as conn:
        pg_app.enqueue("send_receipt", {"order_id": 1}, conn=conn)
        conn.rollback()
    assert pg_app.list_jobs() == []


def test_an_async_psycopg_connection_enqueues_inside_its_transaction(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    async def enqueue_then(commit: bool, order_id: int) -> int:
        async with await psycopg.AsyncConnection.connect(
            pg_schema_url, row_factory=dict_row
        ) as conn:
            job_id = await pg_app.enqueue_async("send_receipt", {"order_id": order_id}, conn=conn)
            with psycopg.connect(pg_schema_url) as other:
                seen = other.execute("SELECT count(*) FROM rq_jobs").fetchone()
                assert seen == (0,), "invisible to others until the caller commits"
            await (conn.commit() if commit else conn.rollback())
            return job_id

    asyncio.run(enqueue_then(False, 1))
    assert pg_app.list_jobs() == []

    kept = asyncio.run(enqueue_then(True, 2))
    assert [job.id for job in pg_app.list_jobs()] == [kept]
    assert run_all(pg_app).stats.succeeded == 1


def test_an_async_enqueue_with_a_bad_payload_names_the_field_and_leaves_the_transaction_usable(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_schema_url) as conn:
            with pytest.raises(replayq.PayloadError, match="'order_id'"):
                await pg_app.enqueue_async("send_receipt", {"order": 1}, conn=conn)
            await pg_app.enqueue_async("send_receipt", {"order_id": 3}, conn=conn)
            await conn.commit()

    asyncio.run(main())
    assert [job.payload for job in pg_app.list_jobs()] == [{"order_id": 3}]


def test_an_async_connection_in_autocommit_is_refused(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_schema_url, autocommit=True) as conn:
            await pg_app.enqueue_async("send_receipt", {"order_id": 1}, conn=conn)

    with pytest.raises(replayq.ConfigurationError, match="autocommit"):
        asyncio.run(main())
    assert pg_app.list_jobs() == []


def test_a_sync_autocommit_connection_is_refused_outside_a_transaction_and_used_inside_one(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        # Outside a transaction each statement would commit alone: refused, nothing written.
        with pytest.raises(replayq.ConfigurationError, match="autocommit"):
            pg_app.enqueue("send_receipt", {"order_id": 1}, conn=conn)
        assert pg_app.list_jobs() == []
        with pytest.raises(KeyError), conn.transaction():
            pg_app.enqueue("send_receipt", {"order_id": 2}, conn=conn)
            raise KeyError("the order was refused")
        assert pg_app.list_jobs() == [], "rolled back with conn.transaction()"
        with conn.transaction():
            kept = pg_app.enqueue("send_receipt", {"order_id": 3}, conn=conn)
    assert [job.id for job in pg_app.list_jobs()] == [kept]


def test_a_connection_in_a_failed_transaction_is_refused_and_stays_the_callers(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    with psycopg.connect(pg_schema_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(replayq.ConfigurationError, match="failed"):
            pg_app.enqueue("send_receipt", {"order_id": 1}, conn=conn)
        conn.rollback()
        kept = pg_app.enqueue("send_receipt", {"order_id": 2}, conn=conn)
        conn.commit()
    assert [job.id for job in pg_app.list_jobs()] == [kept]


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[replayq.App]:
    app = declare(replayq.App(f"sqlite:///{tmp_path / 'shop.db'}"))
    app.list_jobs()
    yield app
    app.close()


def test_a_sqlite_connection_with_row_objects_in_its_default_mode_enqueues_on_commit(
    sqlite_app: replayq.App, tmp_path: Path
) -> None:
    conn = sqlite3.connect(tmp_path / "shop.db")  # default mode: the insert opens the transaction
    conn.row_factory = sqlite3.Row
    job_id = sqlite_app.enqueue("send_receipt", {"order_id": 5}, conn=conn, message_id="o-5")
    assert sqlite_app.enqueue("send_receipt", {"order_id": 5}, conn=conn, message_id="o-5") == (
        job_id
    )
    assert conn.in_transaction
    conn.rollback()
    assert sqlite_app.list_jobs() == []

    job_id = sqlite_app.enqueue("send_receipt", {"order_id": 5}, conn=conn)
    conn.commit()
    conn.close()
    assert run_all(sqlite_app).stats.succeeded == 1
    assert sqlite_app.get_job(job_id).result == 5


def test_an_async_enqueue_carries_the_callers_trace_context_like_enqueue(
    pg_app: replayq.App, pg_schema_url: str
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("shop")

    async def enqueue_in_a_request() -> tuple[int, str]:
        with tracer.start_as_current_span("POST /orders") as request:
            async with await psycopg.AsyncConnection.connect(pg_schema_url) as conn:
                job_id = await pg_app.enqueue_async("send_receipt", {"order_id": 9}, conn=conn)
                await conn.commit()
        return job_id, format(request.get_span_context().trace_id, "032x")

    job_id, trace_id = asyncio.run(enqueue_in_a_request())
    # The worker's attempt span becomes a child of the request, as after App.enqueue.
    assert replayq.otel_trace_id(pg_app.get_job(job_id).trace_context) == trace_id
