"""Enqueue on a SQLAlchemy ``Session`` (or ``AsyncSession``), inside its transaction.

::

    from replayq.contrib.sqlalchemy import enqueue

    with Session(engine) as session, session.begin():
        session.add(order)
        session.flush()
        enqueue(app, "ship_order", {"order_id": order.id}, session=session)
    # the job exists only if the session's transaction committed

    async with AsyncSession(async_engine) as session, session.begin():
        await enqueue_async(app, "ship_order", {"order_id": 7}, session=session)

``session`` may also be a ``Connection`` / ``AsyncConnection`` (``engine.begin()``).
The engine must point at the database the app uses (replayq's tables live there).
Any driver SQLAlchemy supports for SQLite or PostgreSQL works, async ones included
(``aiosqlite``, ``psycopg``): replayq runs on the session's own DB-API connection.

Known limit: on SQLite, create replayq's schema before the first transaction that
enqueues (the first ``App`` use, or ``replayq --db URL db upgrade``): replayq cannot
create its tables while the session holds the file's write lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

import replayq

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

__all__ = ["enqueue", "enqueue_async"]


def enqueue(
    app: replayq.App,
    job_type: str,
    payload: dict[str, Any] | None = None,
    *,
    session: Session | Connection,
    **options: Any,
) -> int:
    """Enqueue inside ``session``'s transaction (begun if it was not); returns the job id.

    ``options`` are ``App.enqueue``'s (``message_id``, ``delay``, ``priority``, …).
    """
    connection = session.connection() if isinstance(session, Session) else session
    dbapi = connection.connection.dbapi_connection
    if dbapi is None:
        raise replayq.ConfigurationError("the session's connection is closed")
    return app.enqueue(job_type, payload, conn=dbapi, **options)


async def enqueue_async(
    app: replayq.App,
    job_type: str,
    payload: dict[str, Any] | None = None,
    *,
    session: AsyncSession | AsyncConnection,
    **options: Any,
) -> int:
    """``enqueue`` for an ``AsyncSession`` or ``AsyncConnection``, on its event loop."""

    def on_sync(sync: Session | Connection) -> int:
        return enqueue(app, job_type, payload, session=sync, **options)

    result: int = await session.run_sync(on_sync)
    return result
