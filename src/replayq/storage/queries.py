"""Loading named SQL queries from a backend's ``queries.sql`` (``-- name: NAME`` headers)."""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(package: str) -> dict[str, str]:
    """Parse every ``*.sql`` file of a backend package (one per domain noun) into ``{name: sql}``.

    Comment lines inside a query are dropped. A name defined twice is an error.
    """
    queries: dict[str, str] = {}
    for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
            sql = "\n".join(lines).strip().rstrip(";").strip()
            if name in queries:
                raise ValueError(f"{package}/{entry.name}: query {name!r} is defined twice")
            queries[name] = sql
    return queries


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """``[(version, name, sql)]`` from ``NNNN_name.sql`` files, in order."""
    found = []
    for entry in resources.files(package).iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)
