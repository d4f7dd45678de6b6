"""How replayq's parameters and result rows cross psycopg cheaply.

Two costs of psycopg's Python layer showed up in a worker's CPU per job (docs/benchmarks.md,
"Round 10 — PostgreSQL worker CPU"):

* A Python ``list`` bound as an array goes through psycopg's list dumper, which walks the
  list to find its element type and dimensions and dumps every element through a dumper
  of its own: ~50 µs for four 8-element arrays in binary, ~110 µs in text. The same arrays
  written as array literals (``{1,2,3}``, ``{"a","b"}``) are one ``str`` each, which the
  statement's cast (every array parameter in replayq's SQL has one: ``%(ids)s::bigint[]``)
  turns into the array on the server: ~30 µs in all.
* ``cursor.description`` builds a ``Column`` object per column (~1 µs each, 32 for a job
  row); the names alone come from the result in C (``PGresult.fname``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SCALARS = frozenset((int, float, str, bool, type(None)))


def _quoted(text: str) -> str:
    """A text element of an array literal: in double quotes, with ``\\`` and ``"`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _element(value: Any) -> str:
    """One element of an array literal, as PostgreSQL's array input reads it."""
    kind = type(value)
    if kind is str:
        return _quoted(value)
    if value is None:
        return "NULL"
    if kind is bool:
        return "t" if value else "f"
    if kind is float:
        return repr(value)  # the shortest text that reads back the same float (inf, nan too)
    return str(value)


def array_literal(values: list[Any]) -> str | None:
    """``values`` as a PostgreSQL array literal, or ``None`` if an element is not a flat
    scalar (``int``, ``float``, ``str``, ``bool``, ``None``): psycopg dumps those lists."""
    kinds = set(map(type, values))
    if kinds == {int}:
        return "{" + ",".join(map(str, values)) + "}"
    if kinds == {str}:
        return "{" + ",".join(map(_quoted, values)) + "}"
    if not kinds <= _SCALARS:
        return None
    return "{" + ",".join(map(_element, values)) + "}"


def arrays_as_literals(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` with each flat ``list`` value as its array literal (the same mapping if
    it holds none). Every array parameter in replayq's SQL is cast to its array type, so a
    literal arrives as the array the list would have been."""
    out: dict[str, Any] | None = None
    for key, value in params.items():
        if type(value) is list:
            literal = array_literal(value)
            if literal is not None:
                if out is None:
                    out = dict(params)
                out[key] = literal
    return params if out is None else out


def column_names(cursor: Any) -> list[str]:
    """The names of the columns of ``cursor``'s current result: from the libpq result
    where the cursor has one (psycopg), else from the DB-API ``description``."""
    result = getattr(cursor, "pgresult", None)
    if result is None:
        return [d[0] for d in cursor.description]
    return [result.fname(i).decode() for i in range(result.nfields)]
