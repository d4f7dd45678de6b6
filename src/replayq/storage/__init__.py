"""Storage backends behind one small protocol (``storage.protocol``)."""

from __future__ import annotations

from replayq.errors import ConfigurationError
from replayq.storage.protocol import Storage


def open_storage(url: str) -> Storage:
    """Open the backend a URL names: ``sqlite:///file.db`` (or a path) or ``postgresql://…``."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from replayq.storage.postgres import PostgresStorage
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ConfigurationError(
                "PostgreSQL support needs the extra: pip install 'replayq[postgres]'"
            ) from exc
        return PostgresStorage(url)
    if "://" in url and not url.startswith("sqlite:"):
        scheme = url.split("://", 1)[0]
        raise ConfigurationError(
            f"unknown database URL scheme {scheme!r}; use sqlite:///path.db or postgresql://…"
        )
    from replayq.storage.sqlite import SqliteStorage

    return SqliteStorage(url)
