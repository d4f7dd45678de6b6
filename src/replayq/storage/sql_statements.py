"""The statement plumbing every SQL verb mixin runs on, declared once.

``SqlTransaction`` (``sql_transaction.py``) implements it over a DB-API connection and
its backend's named queries; the mixins (``ContextVerbs``, ``ReportVerbs``,
``RetentionVerbs``, ``TraceVerbs``) subclass this so that each type-checks on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from replayq.model import TraceEvent

# Bound parameters per statement where the driver cannot say (SQLite's historical default).
_DEFAULT_VARIABLE_LIMIT = 999


class SqlStatements:
    """Named statements on the transaction's connection; see ``SqlTransaction``."""

    # The transaction's DB-API connection (set by ``SqlTransaction.__init__``).
    connection: Any

    def list_param(self, values: Sequence[str] | Sequence[int] | None) -> Any:
        raise NotImplementedError

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def execute_nullable(self, name: str, params: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def execute_rows(self, name: str, row_sql: str, rows: int, values: Sequence[Any]) -> Any:
        raise NotImplementedError

    def send(self, name: str, params: Mapping[str, Any], *, nullable: bool = False) -> None:
        """Run a statement whose result no caller reads (an insert whose rows and row count
        nobody asks); ``nullable``: through ``execute_nullable``. PostgreSQL, in a
        ``pipelined`` block, does not wait for it: an error it makes is raised by the next
        statement that waits (or the ``COMMIT``) and fails the block."""
        raise NotImplementedError

    def send_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """``executemany`` as ``send`` runs one statement: nobody reads its result."""
        raise NotImplementedError

    def rows_per_statement(self, width: int, reserved: int = 0) -> int:
        """How many rows of ``width`` bound values one statement takes beside ``reserved``
        other parameters: the driver's limit on a statement's parameters (SQLite's
        ``SQLITE_LIMIT_VARIABLE_NUMBER``), else ``_DEFAULT_VARIABLE_LIMIT``."""
        limit = getattr(self.connection, "getlimit", None)
        if limit is None:
            most = _DEFAULT_VARIABLE_LIMIT
        else:
            # Imported here: only a SQLite connection has ``getlimit`` (its process has
            # sqlite3 loaded already), and a PostgreSQL worker's start paid for it.
            import sqlite3

            most = limit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        return max(1, (most - reserved) // max(1, width))

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        raise NotImplementedError

    def rows_executed(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> list[Any]:
        raise NotImplementedError

    def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        raise NotImplementedError

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def inserted_id(self, name: str, params: Mapping[str, Any]) -> int | None:
        raise NotImplementedError

    def pack_row(self, events: Sequence[TraceEvent]) -> dict[str, Any]:
        raise NotImplementedError
