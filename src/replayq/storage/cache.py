"""Where ``ctx.cache`` keeps its entries: replayq's own database (default) or Redis.

Known limits: Redis entries are written after the step's database commit, so a
crash between the two leaves the database ahead of the cache (a miss, never a
value newer than its source). The database backend commits each write on its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from msgspec import Struct, structs

from replayq import codec
from replayq.errors import ConfigurationError
from replayq.seal import unsealed
from replayq.storage.protocol import CacheDelete, CacheLookup, CachePut, CacheRecord, Storage


class CacheEntry(Struct, frozen=True):
    key: str
    base_key: str
    value: Any
    version: int | None
    source_namespace: str | None
    source_key: str | None
    written_at: float
    expires_at: float | None


class CacheBackend(Protocol):
    """Where cache entries live. Writes run after the step's database commit."""

    def get(self, key: str, now: float) -> CacheEntry | None: ...

    def latest(self, base_key: str, now: float) -> CacheEntry | None: ...

    def put(self, entry: CacheEntry) -> None: ...

    def delete_base(self, base_key: str) -> None: ...


def _entry(row: CacheRecord) -> CacheEntry:
    return CacheEntry(
        row.key,
        row.base_key,
        codec.loads(row.value),
        row.version,
        row.source_namespace,
        row.source_key,
        row.written_at,
        row.expires_at,
    )


class DatabaseCache:
    """The default backend: the ``rq_cache`` table of replayq's own database."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def get(self, key: str, now: float) -> CacheEntry | None:
        with self._storage.transaction(readonly=True) as tx:
            row = tx.cache_get(CacheLookup(now, key=key))
        return _entry(row) if row is not None else None

    def latest(self, base_key: str, now: float) -> CacheEntry | None:
        with self._storage.transaction(readonly=True) as tx:
            row = tx.cache_get(CacheLookup(now, base_key=base_key))
        return _entry(row) if row is not None else None

    def put(self, entry: CacheEntry) -> None:
        with self._storage.transaction() as tx:
            tx.cache_update(_params(entry))

    def delete_base(self, base_key: str) -> None:
        with self._storage.transaction() as tx:
            tx.cache_update(CacheDelete(base_key=base_key))


def _params(entry: CacheEntry) -> CachePut:
    return CachePut(
        key=entry.key,
        base_key=entry.base_key,
        value=codec.dumps(entry.value, what=f"cache {entry.key}"),
        version=entry.version,
        source_namespace=entry.source_namespace,
        source_key=entry.source_key,
        now=entry.written_at,
        expires_at=entry.expires_at,
    )


F = TypeVar("F", bound=Callable[..., Any])


def _replayq_io(method: F) -> F:
    """Redis is replayq's own connection: a sealed replay must not refuse it."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with unsealed():
            return method(*args, **kwargs)

    return cast(F, wrapper)


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

    @_replayq_io
    def get(self, key: str, now: float) -> CacheEntry | None:
        raw = self._redis.hget(self._hash(key), "entry")
        if raw is None:
            return None
        try:
            entry = CacheEntry(**codec.loads(raw))
        except TypeError as exc:  # another writer's shape: undecodable, like bad JSON
            raise ValueError("a cache entry of an unknown shape") from exc
        if entry.expires_at is not None and entry.expires_at <= now:
            return None
        return entry

    @_replayq_io
    def latest(self, base_key: str, now: float) -> CacheEntry | None:
        for key in self._redis.zrevrange(self._index(base_key), 0, 10):
            entry = self.get(_text(key), now)
            if entry is not None:
                return entry
        return None

    @_replayq_io
    def put(self, entry: CacheEntry) -> None:
        body = codec.dumps(structs.asdict(entry), what=f"cache {entry.key}")
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._hash(entry.key), "entry", body)
        if entry.expires_at is not None:
            pipe.expireat(self._hash(entry.key), int(entry.expires_at) + 1)
        pipe.zadd(self._index(entry.base_key), {entry.key: entry.written_at})
        pipe.execute()

    @_replayq_io
    def delete_base(self, base_key: str) -> None:
        keys = [_text(k) for k in self._redis.zrange(self._index(base_key), 0, -1)]
        pipe = self._redis.pipeline(transaction=True)
        for key in keys:
            pipe.delete(self._hash(key))
        pipe.delete(self._index(base_key))
        pipe.execute()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_cache(storage: Storage, url: str | None) -> CacheBackend:
    """The cache backend named by ``url``: ``None``/``database`` or ``redis://...``."""
    if url is None or url == "database":
        return DatabaseCache(storage)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisCache(url)
    raise ConfigurationError(
        f"unknown cache backend {url!r}; use 'database' or redis://host:port/db"
    )
