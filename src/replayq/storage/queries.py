"""Loading named SQL queries from a backend's ``queries.sql`` (``-- name: NAME`` headers)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def _files(package: str) -> list[Traversable]:
    """The files of ``package``'s directory, read from disk when it is one."""
    directories = [Path(d) for d in importlib.import_module(package).__path__]
    if all(d.is_dir() for d in directories):
        # Not importlib.resources: it imports zipfile and its readers, 16M instructions
        # at every process's start, to list a directory.
        return [entry for d in directories for entry in d.iterdir()]
    from importlib import resources  # installed in a zip archive

    return list(resources.files(package).iterdir())


def load_queries(package: str) -> dict[str, str]:
    """Parse every ``*.sql`` file of a backend package (one per domain noun) into ``{name: sql}``.

    Comment lines inside a query are dropped. A name defined twice is an error.
    """
    queries: dict[str, str] = {}
    for entry in sorted(_files(package), key=lambda e: e.name):
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
    for entry in _files(package):
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)
