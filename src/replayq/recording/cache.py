"""A versioned cache with recorded reads (``ctx.cache``).

Keys are versioned: ``namespace:{id}:v{version}``, where ``version`` is the
version of the entity the value was derived from. ``get(..., version=N)`` reads
exactly that key (cache-aside with versioned keys: a new entity version simply
misses). ``get(...)`` without a version reads the newest entry of the base key —
the shape of an unversioned cache — and is checked against the source entity:
an entry older than the entity's current version is a **stale read**, recorded
and counted. Writes and invalidations take effect when the step commits.

An entry that cannot be decoded (written in another format, by an older or newer
writer, or damaged) reads as a miss and is recorded as ``cache.decode_error``; a
value that cannot be encoded is recorded as ``cache.encode_error`` before the
``PayloadError`` reaches the handler. Both are counted (seed 004's cache
(de)serialisation errors); neither carries the value.

Backends: the database (default) and Redis (``App(cache_url="redis://...")``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec import Struct, structs

from replayq.errors import PayloadError
from replayq.recording.attempt import ENDED, Attempt, ended_error
from replayq.recording.state import read_entity
from replayq.storage.cache import CacheEntry


class CacheRead(Struct, frozen=True):
    """What ``ctx.cache.get`` found: ``hit``, the value, its version, and whether it was stale."""

    key: str
    hit: bool
    value: Any = None
    version: int | None = None
    stale: bool = False
    current_version: int | None = None


def _kind(exc: Exception) -> str:
    """What went wrong, without the value or the key: the exception's class (and, for
    undecodable JSON, the parser's reason, e.g. ``Expecting value``)."""
    reason = getattr(exc, "msg", None)
    return f"{type(exc).__name__}: {reason}" if isinstance(reason, str) else type(exc).__name__


def _versioned(base: str, version: int | None) -> str:
    return base if version is None else f"{base}:v{version}"


def value_shape(value: Any) -> Any:
    """The structure of a value: field names and JSON types, no content.

    ``{"price": 10000, "stock": 5}`` → ``{"price": "int", "stock": "int"}``; a list
    is the shape of its first item (``[]`` when empty).
    """
    if isinstance(value, dict):
        return {str(k): value_shape(v) for k, v in sorted(value.items(), key=lambda i: str(i[0]))}
    if isinstance(value, list | tuple):
        return [value_shape(value[0])] if value else []
    if value is None:
        return "null"
    return type(value).__name__


class CacheView:
    """``ctx.cache``: recorded reads; writes and invalidations after the step commits."""

    def __init__(self, ctx: Attempt) -> None:
        self._ctx = ctx
        self._after_commit: list[Callable[[], None]] = []
        # What the pending actions are, for ``write.fenced``; the step's commit is fenced
        # on the job's lease even when the cache is all it writes.
        self.pending: list[str] = []
        self._namespace_prefix = f"{ctx.namespace}:" if ctx.namespace else ""

    def _base(self, namespace: str, ident: Any) -> str:
        return f"{self._namespace_prefix}{namespace}:{ident}"

    def key(self, namespace: str, ident: Any, version: int | None = None) -> str:
        """The physical key (prefixed with the replay namespace inside a replay or fork)."""
        ctx = self._ctx
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        return _versioned(self._base(namespace, ident), version)

    def get(
        self,
        namespace: str,
        ident: Any,
        *,
        version: int | None = None,
        source: str | None = None,
    ) -> CacheRead:
        """Read ``namespace:ident[:vN]``; ``source`` names the entity namespace it mirrors.

        In a replay the answer is the recorded read; past a fork point the fork's
        own (namespaced) writes are seen first.
        """
        ctx = self._ctx
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.cache.get({namespace!r}, {ident!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        now = ctx.runtime.clock.now()
        key = _versioned(f"{namespace}:{ident}", version)
        read: CacheRead | None = None
        age: float | None = None  # of the entry a live read hit: the TTL expiry pattern
        world = ctx.world
        # Why an entry read as a miss (recorded with the read, below).
        undecodable: str | None = None
        if not world.reads_recorded:
            try:
                entry = self._lookup(namespace, ident, version, now)
            except ValueError as exc:
                # Cache-aside: an entry this code cannot read is a miss, recomputed.
                undecodable = _kind(exc)
                entry = None
            if entry is not None:
                age = round(max(0.0, now - entry.written_at), 3)
            if entry is not None or world.is_live:
                read = self._judge(
                    key, entry, source or (entry.source_namespace if entry else None), ident
                )
        if read is None:
            recorded = world.answer("cache.read", key, "")
            read = CacheRead(**recorded) if isinstance(recorded, dict) else CacheRead(key, False)
        # The read's events in the trace with the ack, or the read refused
        # (``_hold_read``): a thread the handler left running never gets a value whose
        # read the trace does not hold.
        lock = ctx._hold_read()
        try:
            if undecodable is not None:
                ctx.record(
                    "cache.decode_error", status="fail", resource=key, key=key, error=undecodable
                )
            ctx.record(
                "cache.read",
                resource=key,
                resource_version=read.version,
                status="hit" if read.hit else "miss",
                key=key,
                hit=read.hit,
                version=read.version,
                stale=read.stale,
                current_version=read.current_version,
                read=structs.asdict(read),
                **({"age": age} if age is not None and read.hit else {}),
            )
            if read.stale:
                ctx.record(
                    "cache.stale_read",
                    status="fail",
                    resource=key,
                    cached_version=read.version,
                    current_version=read.current_version,
                )
        finally:
            lock.release()
        return read

    def _lookup(
        self, namespace: str, ident: Any, version: int | None, now: float
    ) -> CacheEntry | None:
        backend = self._ctx.runtime.cache_backend
        if version is not None:
            return backend.get(self.key(namespace, ident, version), now)
        return backend.latest(self._base(namespace, ident), now)

    def _judge(
        self, key: str, entry: CacheEntry | None, source: str | None, ident: Any
    ) -> CacheRead:
        current = None
        if source is not None:
            with self._ctx.runtime.storage.transaction(readonly=True) as tx:
                found, _ = read_entity(tx, self._ctx.branch, source, str(ident))
            current = found.version if found else 0
        if entry is None:
            return CacheRead(key, False, current_version=current)
        stale = current is not None and entry.version is not None and entry.version < current
        return CacheRead(key, True, entry.value, entry.version, stale, current)

    def set(
        self,
        namespace: str,
        ident: Any,
        value: Any,
        *,
        version: int | None = None,
        source: str | None = None,
        ttl: float | None = None,
    ) -> str:
        """Cache ``value`` (derived from entity version ``version``) when the step commits."""
        ctx = self._ctx
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.cache.set({namespace!r}, {ident!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        key = self.key(namespace, ident, version)
        logical = _versioned(f"{namespace}:{ident}", version)
        try:
            ctx.encode(value, what=f"cache {logical}")
        except PayloadError as exc:
            # In the trace, or the set refused (``_hold_pending``).
            lock = ctx._hold_pending()
            try:
                ctx.record(
                    "cache.encode_error",
                    status="fail",
                    resource=logical,
                    key=logical,
                    error=_kind(exc),
                )
            finally:
                lock.release()
            raise
        ttl = ttl if ttl is not None else ctx.handler.contract.cache_ttl
        now = ctx.runtime.clock.now()
        entry = CacheEntry(
            key,
            self._base(namespace, ident),
            value,
            version,
            source,
            str(ident) if source else None,
            now,
            now + ttl if ttl else None,
        )
        # Its event and its write join together (the write after the ack's commit, outside
        # steps), or it is refused: not across the attempt's end (``_hold_pending``). In a
        # step of this flow the entry waits in the flow, which no other flow's commit
        # takes: ordered with the end alone, it does not wait for such a commit
        # (``_hold_read``).
        lock = ctx._hold_read() if ctx._in_step() else ctx._hold_pending()
        try:
            ctx.record(
                "cache.write",
                resource=logical,
                resource_version=version,
                key=logical,
                ttl=ttl,
                # The value's shape, not its content: rollout verify flags a new shape under
                # an old key.
                shape=value_shape(value),
            )
            # A replay writes only under its own namespace, and not before a fork point.
            if ctx.world.writes_apply:
                self._hold(lambda: ctx.runtime.cache_backend.put(entry), f"cache {logical}")
        finally:
            lock.release()
        return logical

    def invalidate(self, namespace: str, ident: Any) -> None:
        """Drop every version of ``namespace:ident`` when the step commits."""
        ctx = self._ctx
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.cache.invalidate({namespace!r}, {ident!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        base = self._base(namespace, ident)
        logical = f"{namespace}:{ident}"
        # As ``set``'s: together, or refused.
        lock = ctx._hold_read() if ctx._in_step() else ctx._hold_pending()
        try:
            ctx.record("cache.invalidate", resource=logical, key=logical)
            if ctx.world.writes_apply:
                action = lambda: ctx.runtime.cache_backend.delete_base(base)  # noqa: E731
                self._hold(action, f"cache invalidation {logical}")
        finally:
            lock.release()

    def _hold(self, action: Callable[[], None], what: str) -> None:
        """``action`` after the commit of the step running in this thread or task (held in
        it: a commit of another's, or the ack, does not make it), or of the attempt's next
        commit outside steps. Outside steps under ``_pending_lock`` (the caller's
        ``_hold_pending``): not across a commit of another flow's, which runs and empties
        these lists, nor across the attempt's end; in a step under ``_end_lock``
        (``_hold_read``): the step's own list, not across the end."""
        if not self._ctx._defer_after_commit(action, what):
            self._after_commit.append(action)
            self.pending.append(what)

    def adopt(self, held: list[tuple[Callable[[], None], str]]) -> None:
        """The actions a step held (``_hold``) wait for the commit that follows at once."""
        with self._ctx._pending_lock:
            for action, what in held:
                self._after_commit.append(action)
                self.pending.append(what)

    def after_commit(self) -> None:
        todo, self._after_commit = self._after_commit, []
        self.pending = []
        for action in todo:
            action()

    def take_after_commit(self) -> list[Callable[[], None]]:
        """Hand over what waits for the step's commit instead of running it: a dry-run runs
        it after its one write at the end, or (``keep=False``) never."""
        todo, self._after_commit = self._after_commit, []
        self.pending = []
        return todo

    def discard_pending(self) -> None:
        self._after_commit.clear()
        self.pending = []
