"""``replayq.contrib.sqlalchemy`` with real engines: sync and async sessions, SQLite and PostgreSQL.

A job enqueued in a session's transaction exists only if that transaction commits,
together with the session's own rows; a worker then runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Integer, String, create_engine, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import replayq
from replayq.contrib.sqlalchemy import enqueue, enqueue_async


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(20))


class Boom(Exception):
    pass


@dataclass
class Database:
    replayq_url: str
    sync_url: str
    async_url: str


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        path = tmp_path / "shop.db"
        return Database(f"sqlite:///{path}", f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}")
    url = str(request.getfixturevalue("pg_schema_url"))  # search_path is the test's schema
    rest = url.removeprefix("postgresql://")
    return Database(url, f"postgresql+psycopg://{rest}", f"postgresql+psycopg://{rest}")


@pytest.fixture
def app(database: Database) -> Iterator[replayq.App]:
    app = replayq.App(database.replayq_url, auto_migrate=True)

    @app.job("confirm_order")
    def confirm_order(ctx: replayq.Context, order_id: int) -> int:
        return order_id

    app.list_jobs()  # replayq's schema first (SQLite: before a session holds the write lock)
    engine = create_engine(database.sync_url)
    Base.metadata.create_all(engine)
    engine.dispose()
    yield app
    app.close()


def committed(app: replayq.App) -> list[int]:
    return sorted(job.payload["order_id"] for job in app.list_jobs())


def run_all(app: replayq.App) -> int:
    """Run every due job; how many succeeded."""
    return replayq.Worker(app, burst=True, poll_interval=0.01).run().succeeded


def test_a_sync_session_commits_or_rolls_back_the_job_with_its_rows(
    app: replayq.App, database: Database
) -> None:
    engine = create_engine(database.sync_url)
    try:
        with pytest.raises(Boom), Session(engine) as session, session.begin():
            session.add(Order(id=1, status="paid"))
            session.flush()
            enqueue(app, "confirm_order", {"order_id": 1}, session=session)
            raise Boom
        assert committed(app) == []

        with Session(engine) as session, session.begin():
            session.add(Order(id=2, status="paid"))
            enqueue(app, "confirm_order", {"order_id": 2}, session=session, message_id="o-2")
            assert committed(app) == [], "invisible to others until the session commits"
        with engine.begin() as connection:  # a bare Connection works too
            enqueue(app, "confirm_order", {"order_id": 3}, session=connection)

        with Session(engine) as session:
            assert session.scalars(select(Order.id)).all() == [2]
    finally:
        engine.dispose()
    assert committed(app) == [2, 3]
    assert run_all(app) == 2


def test_a_job_enqueued_in_a_rolled_back_savepoint_is_gone_and_its_message_id_free(
    app: replayq.App, database: Database
) -> None:
    engine = create_engine(database.sync_url)
    try:
        with Session(engine) as session, session.begin():
            session.add(Order(id=4, status="paid"))
            session.flush()
            savepoint = session.begin_nested()
            enqueue(app, "confirm_order", {"order_id": 4}, session=session, message_id="o")
            savepoint.rollback()
            # The rolled-back job is not what the message id answers now: a new one is made,
            # and the same id again in this transaction is that one.
            again = enqueue(app, "confirm_order", {"order_id": 5}, session=session, message_id="o")
            twice = enqueue(app, "confirm_order", {"order_id": 6}, session=session, message_id="o")
            assert again == twice
        with Session(engine) as session:
            assert session.scalars(select(Order.id)).all() == [4]
    finally:
        engine.dispose()
    assert committed(app) == [5]
    assert [job.id for job in app.list_jobs()] == [again]
    assert run_all(app) == 1


def test_an_async_session_commits_or_rolls_back_the_job_with_its_rows(
    app: replayq.App, database: Database
) -> None:
    async def main() -> None:
        engine = create_async_engine(database.async_url)
        try:
            with pytest.raises(Boom):
                async with AsyncSession(engine) as session, session.begin():
                    session.add(Order(id=1, status="paid"))
                    await session.flush()
                    await enqueue_async(app, "confirm_order", {"order_id": 1}, session=session)
                    raise Boom
            assert committed(app) == []

            async with AsyncSession(engine) as session, session.begin():
                session.add(Order(id=2, status="paid"))
                await enqueue_async(app, "confirm_order", {"order_id": 2}, session=session)
                with pytest.raises(replayq.PayloadError, match="'order_id'"):
                    await enqueue_async(app, "confirm_order", {"order": 2}, session=session)
            async with engine.begin() as connection:
                await enqueue_async(app, "confirm_order", {"order_id": 3}, session=connection)
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert committed(app) == [2, 3]
    assert run_all(app) == 2
