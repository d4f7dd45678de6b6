"""Versioned schema migrations, shared numbering across backends (``NNNN_name.sql``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from replayq.errors import SchemaError
from replayq.storage.protocol import MigrationStatus
from replayq.storage.queries import load_migrations

# A migration that drops a table (to copy it, or to put a view in its place) or a view (to
# make it again) drops what hangs on it: its indexes and triggers (on PostgreSQL its rules,
# policies and statistics too). Those replayq made, the migration makes again; the
# database owner's, each backend's runner keeps or refuses the upgrade over, naming them.
# Patterns, not compiled at import: every process imports this module, few run a migration
# that drops something (re compiles each on its first use, ~1M instructions each).
_DROPS = r"^\s*DROP\s+(?:TABLE|(?:MATERIALIZED\s+)?VIEW)\s+(?:IF\s+EXISTS\s+)?([^;]+)"
_CREATES = (
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+|MATERIALIZED\s+)?(?:INDEX|TRIGGER|VIEW)"
    r"\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)"
)
_COMMENTS = r"--[^\n]*"
_WORDS = r"\w+"
_LINES = re.I | re.M


class ReplayqNames:
    """What replayq's migrations name (lower case), to tell replayq's from the owner's:
    an object of the owner's is one whose name no script creates (replayq's are all
    ``rq_...``); a column of the owner's, one no script names at all (comments left out).
    Read from the scripts the first time a runner asks, which only a migration that
    drops a table or view makes it do."""

    def __init__(self, scripts: Callable[[], Iterable[str]]) -> None:
        self._scripts = scripts

    @functools.cached_property
    def _objects(self) -> frozenset[str]:
        scripts = self._scripts()
        return frozenset(n.lower() for s in scripts for n in re.findall(_CREATES, s, _LINES))

    @functools.cached_property
    def _words(self) -> frozenset[str]:
        code = (re.sub(_COMMENTS, "", script).lower() for script in self._scripts())
        return frozenset(word for text in code for word in re.findall(_WORDS, text))

    def made(self, kind: str, name: str) -> bool:
        """Whether the ``kind`` (``index``, ``column``, ...) ``name`` is replayq's. A column
        of the owner's named like a word of replayq's SQL passes for replayq's: the check
        errs towards what replayq made."""
        return name.lower() in (self._words if kind == "column" else self._objects)


def replayq_names(scripts: Sequence[str]) -> ReplayqNames:
    """What ``scripts`` name (a runner's tests give their own)."""
    return ReplayqNames(lambda: scripts)


def replayq_names_of(package: str) -> ReplayqNames:
    """What the migrations of ``package`` name, read only if asked."""
    return ReplayqNames(lambda: [sql for _, _, sql in load_migrations(package)])


def dropped_relations(script: str) -> frozenset[str]:
    """The tables and views ``script`` drops (lower case, as written, without quotes or
    schema: a migration names them through the search path)."""
    names = set()
    for listed in re.findall(_DROPS, script, _LINES):
        for item in listed.split(","):
            words = item.split()
            if words:  # the name, not a CASCADE or RESTRICT after it
                names.add(words[0].split(".")[-1].strip('"`[]').lower())
    return frozenset(names)


def owner_object_refused(what: str, why: str, drop: str) -> SchemaError:
    """The refusal of an upgrade that would lose ``what`` of the owner's (``the trigger
    'x' on 'rq_events'``): ``why``, and what to do (``drop``, the statement that drops it)."""
    return SchemaError(
        f"the {what} is not replayq's and cannot be kept: {why}. Nothing was changed: "
        f"drop it ({drop}), upgrade, then create what still applies"
    )


def owner_column_refused(column: str, table: str) -> SchemaError:
    """The refusal of an upgrade whose copy of ``table`` would lose the owner's ``column``."""
    why = (
        f"this upgrade drops {table!r} (to copy it, or to put a view in its place) and "
        f"copies the columns it knows: the column's values would be lost"
    )
    drop = f"ALTER TABLE {table} DROP COLUMN {column}"
    return owner_object_refused(f"column {column!r} of {table!r}", why, drop)


def migration_status(applied: list[tuple[int, str, float]], package: str) -> list[MigrationStatus]:
    """Every known migration with its applied time (``None`` when pending)."""
    known = load_migrations(package)
    when = {version: at for version, _, at in applied}
    newest_known = max((v for v, _, _ in known), default=0)
    newer = [v for v in when if v > newest_known]
    if newer:
        raise SchemaError(
            f"the database has schema version {max(newer)}, newer than this replayq "
            f"understands ({newest_known}); upgrade replayq"
        )
    return [MigrationStatus(version, name, when.get(version)) for version, name, _ in known]


def pending(statuses: list[MigrationStatus]) -> list[int]:
    return [s.version for s in statuses if s.applied_at is None]


def apply_pending(
    package: str,
    applied: list[tuple[int, str, float]],
    run_script: Callable[[str], Any],
    record: Callable[[int, str], Any],
) -> list[MigrationStatus]:
    """Run each pending migration's script, then record it; the caller holds the transaction."""
    statuses = migration_status(applied, package)
    todo = set(pending(statuses))
    done = []
    for version, name, sql in load_migrations(package):
        if version in todo:
            try:
                run_script(sql)
            except SchemaError as exc:  # an upgrade refused: which migration refused it
                raise SchemaError(f"migration {version:04d} ({name}): {exc}") from exc
            record(version, name)
            done.append(MigrationStatus(version, name, None))
    return done
