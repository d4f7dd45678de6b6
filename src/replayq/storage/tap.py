"""A storage that tells listeners which trace events committed.

Metrics, OpenTelemetry and job logs are all derived from the trace, so they
listen at the one place every event passes: ``trace_append`` (and ``job_enqueue``,
which writes each new job's ``job.enqueued`` with its row). Events are
handed over only after their transaction committed; a rolled-back transaction
(a fenced step, a lost compare-and-set) reports nothing, so a counter never
counts what did not happen.

Listeners run on the committing thread, right after the commit: they must be
quick and must not raise (an exception is logged and swallowed; the commit has
happened and the caller must see it succeed). The wrapper exists only while a
listener is registered (``Runtime.add_tap``): without one, storage is not wrapped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from replayq.model import TraceEvent
from replayq.storage.lifecycle_packs import enqueued_event
from replayq.storage.protocol import (
    JobInsert,
    MigrationStatus,
    Storage,
    TraceFence,
    Transaction,
)
from replayq.storage.sql_transaction import with_job_id

log = logging.getLogger("replayq.tap")

Listener = Callable[[Sequence[TraceEvent]], None]


class Taps:
    """The listeners of one runtime; registration is thread-safe, emission lock-free."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.listeners: tuple[Listener, ...] = ()

    def add(self, listener: Listener) -> None:
        with self._lock:
            self.listeners = (*self.listeners, listener)

    def remove(self, listener: Listener) -> None:
        with self._lock:
            # Bound methods are new objects at each access: compare by equality, not identity.
            self.listeners = tuple(x for x in self.listeners if x != listener)

    def emit(self, events: Sequence[TraceEvent]) -> None:
        for listener in self.listeners:
            try:
                listener(events)
            except Exception:
                log.exception("trace listener %r failed; the events did commit", listener)


class _TappedTransaction:
    """Forwards every verb; keeps the events ``trace_append`` wrote."""

    def __init__(self, inner: Transaction) -> None:
        self._inner = inner
        self.appended: list[TraceEvent] = []

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        if not self._inner.trace_append(events, fence):
            return False
        self.appended.extend(events)
        return True

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        inserted = self._inner.job_enqueue(params)
        self.appended.extend(
            with_job_id(enqueued_event(p), job_id)
            for p, (job_id, created) in zip(params, inserted, strict=True)
            if created
        )
        return inserted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TappedStorage:
    """``storage`` whose committed trace events go to ``taps``."""

    def __init__(self, storage: Storage, taps: Taps) -> None:
        self.inner = storage
        self.taps = taps
        self.url = storage.url
        self.dialect = storage.dialect

    @contextmanager
    def transaction(self, *, readonly: bool = False) -> Iterator[Transaction]:
        with self.inner.transaction(readonly=readonly) as tx:
            tapped = _TappedTransaction(tx)
            yield cast(Transaction, tapped)
        # Reached only once the inner transaction committed.
        if tapped.appended:
            self.taps.emit(tapped.appended)

    def adopt(self, connection: Any) -> Transaction:
        # The caller commits its own transaction, out of our sight: nothing is reported.
        return self.inner.adopt(connection)

    def migrate(self, now: float) -> list[MigrationStatus]:
        return self.inner.migrate(now)

    def migration_status(self) -> list[MigrationStatus]:
        return self.inner.migration_status()

    def connections(self) -> int:
        return self.inner.connections()

    def close(self) -> None:
        self.inner.close()

    def _autocommit(self) -> Iterator[Transaction]:
        autocommit = self.inner.autocommit  # type: ignore[attr-defined]
        with autocommit() as tx:
            tapped = _TappedTransaction(tx)
            yield cast(Transaction, tapped)
        if tapped.appended:
            self.taps.emit(tapped.appended)

    def __getattr__(self, name: str) -> Any:
        # Optional capabilities (``listen`` on PostgreSQL) pass through; ``autocommit``
        # (where the inner storage has it) is tapped as ``transaction`` is.
        found = getattr(self.inner, name)
        if name == "autocommit":
            return contextmanager(self._autocommit)
        return found
