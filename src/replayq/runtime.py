"""The runtime: what every layer below the facade is given instead of the ``App``.

``App`` is the composition root: it reads the URL and options once and builds a
``Runtime`` — storage (opened, and on SQLite migrated, on first use), clock,
hybrid logical clock, random source, the handler registry, limits and the cache
backend. The queue, the recording context, the replay engine and the worker
take a ``Runtime`` (or, for the public replay verbs, anything with a
``runtime`` attribute, such as the ``App`` itself) and never import ``App``.

The runtime is frozen: its parts are chosen once. The storage and cache backend
are opened lazily behind a lock, so importing a handler module connects to
nothing; ``close()`` closes them (the next use opens them again).
"""

from __future__ import annotations

import random
import threading
from typing import Protocol

from msgspec import Struct, field, structs

from replayq.clock import Clock, HybridLogicalClock, SystemClock
from replayq.errors import SchemaError
from replayq.queue.handlers import Handler, HandlerRegistry
from replayq.redaction import Redactor
from replayq.storage import open_storage
from replayq.storage.cache import CacheBackend, open_cache
from replayq.storage.migrate import pending
from replayq.storage.protocol import Storage
from replayq.storage.tap import Listener, TappedStorage, Taps

INLINE_LIMIT_BYTES = 2048
DEFAULT_BLOB_LIMIT_BYTES = 16 * 1024 * 1024
UNCHECKED_MAX_PAYLOAD_BYTES = 256 * 1024


class Limits(Struct, frozen=True):
    """Sizes replayq enforces: recorded values, and payloads of undeclared job types."""

    blob_limit_bytes: int = DEFAULT_BLOB_LIMIT_BYTES
    inline_limit_bytes: int = INLINE_LIMIT_BYTES
    unchecked_max_payload_bytes: int = UNCHECKED_MAX_PAYLOAD_BYTES


class RuntimeSource(Protocol):
    """Anything that carries a runtime: the ``App``, or a ``Runtime`` itself."""

    @property
    def runtime(self) -> Runtime: ...


class _Opened:
    """The lazily opened connections of one runtime (the one mutable part, behind a lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.storage: Storage | None = None
        self.cache: CacheBackend | None = None
        # Listeners of committed trace events (metrics, OpenTelemetry, job logs).
        self.taps = Taps()
        self.tapped: Storage | None = None


# A frozen Struct compared by identity, not a frozen dataclass: built in C, where the
# dataclass compiled its methods at every process's start.
class Runtime(Struct, frozen=True, eq=False):
    """Storage, clocks, randomness, handlers and limits, as the layers below ``App`` see them."""

    url: str
    clock: Clock
    hlc: HybridLogicalClock
    rng: random.Random
    registry: HandlerRegistry
    limits: Limits = field(default_factory=Limits)
    cache_url: str | None = None
    auto_migrate: bool | None = None
    # Secrets redaction (``replayq.redaction``): the app's rules and HMAC key.
    redactor: Redactor = field(default_factory=Redactor.build)
    _opened: _Opened = field(default_factory=_Opened)

    @property
    def runtime(self) -> Runtime:
        return self

    @property
    def leases_by_database(self) -> bool:
        """Whether leases are judged by the database's clock, not by ``clock``.

        Yes with the real clock (``SystemClock``, or a subclass: a real wall clock, even a
        wrong one): every worker's leases are then granted, extended and reaped in one
        time, SQLite's (the host's) or the PostgreSQL server's, however far the workers'
        own clocks drift. No with a clock of another kind (``FrozenClock``, a test's): that
        clock is the only one that moves, so it judges leases too.
        """
        return isinstance(self.clock, SystemClock)

    def redactor_for(self, job_type: str | None) -> Redactor:
        """The redaction rules of ``job_type``: its handler's, else the app's."""
        registry = self.registry
        if job_type is not None and registry.declares(job_type):
            return self.redactor_of(registry.handler(job_type))
        return self.redactor

    def redactor_of(self, handler: Handler) -> Redactor:
        """The redaction rules of a handler already looked up: its own, else the app's."""
        return handler.redactor if handler.redactor is not None else self.redactor

    def scratch(self, url: str) -> Runtime:
        """A runtime on another database with the same handlers (replaying an exported case)."""
        return structs.replace(
            self, url=url, hlc=HybridLogicalClock(self.clock), auto_migrate=True, _opened=_Opened()
        )

    @property
    def storage(self) -> Storage:
        """The backend, opened (and on SQLite migrated) on first use."""
        opened = self._opened
        if opened.tapped is not None:
            return opened.tapped
        if opened.storage is not None and not opened.taps.listeners:
            return opened.storage
        with opened.lock:
            if opened.storage is None:
                opened.storage = self._open_storage()
            if opened.taps.listeners and opened.tapped is None:
                opened.tapped = TappedStorage(opened.storage, opened.taps)
            return opened.tapped or opened.storage

    def add_tap(self, listener: Listener) -> None:
        """Call ``listener(events)`` with the trace events of every transaction that commits.

        See ``replayq.storage.tap``. Until a listener is added storage is not wrapped.
        """
        with self._opened.lock:
            self._opened.taps.add(listener)
        self.storage  # noqa: B018 -- opens and wraps the storage now

    def remove_tap(self, listener: Listener) -> None:
        """Stop calling ``listener``; the last one removed unwraps storage."""
        opened = self._opened
        with opened.lock:
            opened.taps.remove(listener)
            if not opened.taps.listeners:
                opened.tapped = None

    def _open_storage(self) -> Storage:
        storage = open_storage(self.url)
        auto = self.auto_migrate
        if auto is None:
            auto = storage.dialect == "sqlite"
        if auto:
            storage.migrate(self.clock.now())
            return storage
        todo = pending(storage.migration_status())
        if todo:
            storage.close()
            raise SchemaError(
                f"the schema of {storage.dialect} database is behind (pending migrations "
                f"{todo}); run: replayq --db URL db upgrade"
            )
        return storage

    @property
    def cache_backend(self) -> CacheBackend:
        """Where ``ctx.cache`` keeps entries: the database, or Redis with ``cache_url``."""
        opened = self._opened
        if opened.cache is None:
            storage = self.storage
            with opened.lock:
                if opened.cache is None:
                    opened.cache = open_cache(storage, self.cache_url)
        return opened.cache

    def close(self) -> None:
        """Close every connection this runtime opened."""
        with self._opened.lock:
            if self._opened.storage is not None:
                self._opened.storage.close()
            self._opened.storage = None
            self._opened.tapped = None
            self._opened.cache = None
