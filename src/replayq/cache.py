"""A versioned cache with recorded reads (``ctx.cache``).

Keys are versioned: ``namespace:{id}:v{version}``, where ``version`` is the
version of the entity the value was derived from. ``get(..., version=N)`` reads
exactly that key (cache-aside with versioned keys: a new entity version simply
misses). ``get(...)`` without a version reads the newest entry of the base key —
the shape of an unversioned cache — and is checked against the source entity:
an entry older than the entity's current version is a **stale read**, recorded
and counted. Writes and invalidations take effect when the step commits.

Backends: the database (default) and Redis (``App(cache_url="redis://...")``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from replayq import codec
from replayq.state import read_entity
from replayq.storage.protocol import Row

if TYPE_CHECKING:
    from replayq.app import App
    from replayq.context import Context


@dataclass(frozen=True)
class CacheEntry:
    key: str
    base_key: str
    value: Any
    version: int | None
    source_namespace: str | None
    source_key: str | None
    written_at: float
    expires_at: float | None


@dataclass(frozen=True)
class CacheRead:
    """What ``ctx.cache.get`` found: ``hit``, the value, its version, and whether it was stale."""

    key: str
    hit: bool
    value: Any = None
    version: int | None = None
    stale: bool = False
    current_version: int | None = None


class CacheBackend(Protocol):
    """Where cache entries live. Writes run after the step's database commit."""

    def get(self, key: str, now: float) -> CacheEntry | None: ...

    def latest(self, base_key: str, now: float) -> CacheEntry | None: ...

    def put(self, entry: CacheEntry) -> None: ...

    def delete_base(self, base_key: str) -> None: ...


def _entry(row: Row) -> CacheEntry:
    return CacheEntry(
        row["key"],
        row["base_key"],
        codec.loads(row["value"]),
        row["version"],
        row["source_namespace"],
        row["source_key"],
        row["written_at"],
        row["expires_at"],
    )


class DatabaseCache:
    """The default backend: the ``rq_cache`` table of replayq's own database."""

    def __init__(self, app: App) -> None:
        self._app = app

    def get(self, key: str, now: float) -> CacheEntry | None:
        with self._app.storage.transaction(readonly=True) as tx:
            row = tx.cache_get(key, now)
        return _entry(row) if row else None

    def latest(self, base_key: str, now: float) -> CacheEntry | None:
        with self._app.storage.transaction(readonly=True) as tx:
            row = tx.cache_latest(base_key, now)
        return _entry(row) if row else None

    def put(self, entry: CacheEntry) -> None:
        with self._app.storage.transaction() as tx:
            tx.cache_put(_params(entry))

    def delete_base(self, base_key: str) -> None:
        with self._app.storage.transaction() as tx:
            tx.cache_delete_base(base_key)


def _params(entry: CacheEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "base_key": entry.base_key,
        "value": codec.dumps(entry.value, what=f"cache {entry.key}"),
        "version": entry.version,
        "source_namespace": entry.source_namespace,
        "source_key": entry.source_key,
        "now": entry.written_at,
        "expires_at": entry.expires_at,
    }


class RedisCache:
    """Redis backend: one hash per key, a sorted set per base key ordered by write time."""

    def __init__(self, url: str, prefix: str = "replayq:cache:") -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._prefix = prefix

    def _hash(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def _index(self, base_key: str) -> str:
        return f"{self._prefix}index:{base_key}"

    def get(self, key: str, now: float) -> CacheEntry | None:
        raw = self._redis.hget(self._hash(key), "entry")
        if raw is None:
            return None
        entry = CacheEntry(**codec.loads(raw))
        if entry.expires_at is not None and entry.expires_at <= now:
            return None
        return entry

    def latest(self, base_key: str, now: float) -> CacheEntry | None:
        for key in self._redis.zrevrange(self._index(base_key), 0, 10):
            entry = self.get(_text(key), now)
            if entry is not None:
                return entry
        return None

    def put(self, entry: CacheEntry) -> None:
        body = codec.dumps(vars(entry), what=f"cache {entry.key}")
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._hash(entry.key), "entry", body)
        if entry.expires_at is not None:
            pipe.expireat(self._hash(entry.key), int(entry.expires_at) + 1)
        pipe.zadd(self._index(entry.base_key), {entry.key: entry.written_at})
        pipe.execute()

    def delete_base(self, base_key: str) -> None:
        keys = [_text(k) for k in self._redis.zrange(self._index(base_key), 0, -1)]
        pipe = self._redis.pipeline(transaction=True)
        for key in keys:
            pipe.delete(self._hash(key))
        pipe.delete(self._index(base_key))
        pipe.execute()


def _versioned(base: str, version: int | None) -> str:
    return base if version is None else f"{base}:v{version}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_cache(app: App, url: str | None) -> CacheBackend:
    if url is None or url == "database":
        return DatabaseCache(app)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisCache(url)
    from replayq.errors import ConfigurationError

    raise ConfigurationError(
        f"unknown cache backend {url!r}; use 'database' or redis://host:port/db"
    )


class CacheView:
    """``ctx.cache``: recorded reads; writes and invalidations after the step commits."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._after_commit: list[Callable[[], None]] = []
        self._namespace_prefix = f"{ctx.namespace}:" if ctx.namespace else ""

    def _base(self, namespace: str, ident: Any) -> str:
        return f"{self._namespace_prefix}{namespace}:{ident}"

    def key(self, namespace: str, ident: Any, version: int | None = None) -> str:
        """The physical key (prefixed with the replay namespace inside a replay or fork)."""
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
        now = ctx.app.clock.now()
        key = _versioned(f"{namespace}:{ident}", version)
        read: CacheRead | None = None
        sub = ctx.substitution
        if sub is None or not sub.reads_recorded:
            entry = self._lookup(namespace, ident, version, now)
            if entry is not None or sub is None:
                read = self._judge(
                    key, entry, source or (entry.source_namespace if entry else None), ident
                )
        if read is None:
            assert sub is not None
            recorded = sub.answer("cache.read", key, "")
            read = CacheRead(**recorded) if isinstance(recorded, dict) else CacheRead(key, False)
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
            read=vars(read),
        )
        if read.stale:
            ctx.record(
                "cache.stale_read",
                status="fail",
                resource=key,
                cached_version=read.version,
                current_version=read.current_version,
            )
        return read

    def _lookup(
        self, namespace: str, ident: Any, version: int | None, now: float
    ) -> CacheEntry | None:
        backend = self._ctx.app.cache_backend
        if version is not None:
            return backend.get(self.key(namespace, ident, version), now)
        return backend.latest(self._base(namespace, ident), now)

    def _judge(
        self, key: str, entry: CacheEntry | None, source: str | None, ident: Any
    ) -> CacheRead:
        current = None
        if source is not None:
            with self._ctx.app.storage.transaction(readonly=True) as tx:
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
        key = self.key(namespace, ident, version)
        logical = _versioned(f"{namespace}:{ident}", version)
        ctx.encode(value, what=f"cache {logical}")
        ttl = ttl if ttl is not None else ctx.handler.contract.cache_ttl
        now = ctx.app.clock.now()
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
        ctx.record("cache.write", resource=logical, resource_version=version, key=logical, ttl=ttl)
        # A replay writes only under its own namespace, and not before a fork point.
        if ctx.substitution is None or ctx.substitution.writes_apply:
            self._after_commit.append(lambda: ctx.app.cache_backend.put(entry))
        return logical

    def invalidate(self, namespace: str, ident: Any) -> None:
        """Drop every version of ``namespace:ident`` when the step commits."""
        ctx = self._ctx
        base = self._base(namespace, ident)
        logical = f"{namespace}:{ident}"
        ctx.record("cache.invalidate", resource=logical, key=logical)
        if ctx.substitution is None or ctx.substitution.writes_apply:
            self._after_commit.append(lambda: ctx.app.cache_backend.delete_base(base))

    def after_commit(self) -> None:
        todo, self._after_commit = self._after_commit, []
        for action in todo:
            action()

    def discard_pending(self) -> None:
        self._after_commit.clear()
