"""The caller's own connection, for transactional enqueue: rows as tuples, async bridged.

``Storage.adopt(connection)`` runs the enqueue verbs inside a transaction the caller
opened and will commit or roll back. The caller chose that connection's row factory
(psycopg ``dict_row``, ``sqlite3.Row``, a framework's own) and replayq must not change
it, so the verbs see it through ``TupleRows``: cursors whose rows are plain tuples.

An async connection (``psycopg.AsyncConnection``) is driven by the same synchronous
verbs through ``run_bridged``: the verbs run in a greenlet, and each driver call they
make is awaited on the caller's event loop (the technique SQLAlchemy's asyncio layer
uses). Known limit: ``greenlet`` must be installed (it comes with ``replayq[postgres]``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from replayq.errors import ConfigurationError

T = TypeVar("T")


def _as_tuple(row: Any, description: Sequence[Any] | None) -> Any:
    if row is None or type(row) is tuple:
        return row
    if isinstance(row, Mapping):  # dict_row, a dict-making sqlite3 row factory
        return tuple(row[column[0]] for column in description or ())
    return tuple(row)  # sqlite3.Row, namedtuple rows, lists


class TupleCursor:
    """A DB-API cursor whose rows come back as tuples, whatever the connection's factory."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> Any:
        """The DB-API extension SQLite's inserts read their new id from."""
        return self._cursor.lastrowid

    def execute(self, sql: str, params: Any = None) -> TupleCursor:
        self._cursor.execute(sql, params if params is not None else {})
        return self

    def executemany(self, sql: str, rows: Sequence[Any]) -> None:
        self._cursor.executemany(sql, rows)

    def fetchone(self) -> Any:
        return _as_tuple(self._cursor.fetchone(), self._cursor.description)

    def fetchall(self) -> list[Any]:
        description = self._cursor.description
        return [_as_tuple(row, description) for row in self._cursor.fetchall()]


class TupleRows:
    """A caller's DB-API connection as the verbs use it: ``execute`` and ``cursor`` only."""

    def __init__(self, connection: Any) -> None:
        self.raw = connection

    def cursor(self) -> TupleCursor:
        return TupleCursor(self.raw.cursor())

    def execute(self, sql: str, params: Any = None) -> TupleCursor:
        return self.cursor().execute(sql, params)


def _greenlet() -> Any:
    try:
        import greenlet
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError(
            "enqueue_async needs greenlet: pip install 'replayq[postgres]'"
        ) from exc
    return greenlet


def await_(awaitable: Any) -> Any:
    """Inside ``run_bridged``: hand ``awaitable`` to the event loop and return its result."""
    if not inspect.isawaitable(awaitable):
        return awaitable
    current = _greenlet().getcurrent()
    if getattr(current, "replayq_bridge", False) is not True:
        raise ConfigurationError("an async connection is used outside enqueue_async")
    return current.parent.switch(awaitable)


class _AsyncCursorView:
    """An async DB-API cursor (psycopg ``AsyncCursor``) driven synchronously via ``await_``."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def execute(self, sql: str, params: Any = None) -> _AsyncCursorView:
        await_(self._cursor.execute(sql, params))
        return self

    def executemany(self, sql: str, rows: Sequence[Any]) -> None:
        await_(self._cursor.executemany(sql, rows))

    def fetchone(self) -> Any:
        return await_(self._cursor.fetchone())

    def fetchall(self) -> Any:
        return await_(self._cursor.fetchall())


class AsyncConnectionView:
    """An async connection seen as a synchronous DB-API one, valid inside ``run_bridged``."""

    def __init__(self, connection: Any) -> None:
        self.raw = connection

    def cursor(self) -> _AsyncCursorView:
        return _AsyncCursorView(await_(self.raw.cursor()))


async def run_bridged(fn: Callable[[], T]) -> T:
    """Run the synchronous ``fn`` on this event loop, awaiting each ``await_`` it makes."""
    greenlet = _greenlet()
    worker = greenlet.greenlet(fn)
    worker.replayq_bridge = True
    step: Any = worker.switch()
    while not worker.dead:
        awaitable: Awaitable[Any] = step
        try:
            value = await awaitable
        except BaseException as exc:  # the driver's error goes back into the verbs
            step = worker.throw(exc)
        else:
            step = worker.switch(value)
    result: T = step
    return result
