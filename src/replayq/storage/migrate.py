"""Versioned schema migrations, shared numbering across backends (``NNNN_name.sql``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from replayq.errors import SchemaError
from replayq.storage.protocol import MigrationStatus
from replayq.storage.queries import load_migrations

# A migration that drops a table (to copy it, or to put a view in its place) or a view (to
# make it again) drops what hangs on it: its indexes and triggers (on PostgreSQL its rules,
# policies and statistics too). Those replayq made, the migration makes again; the
# database owner's, each backend's runner keeps or refuses the upgrade over, naming them.
_DROPS = re.compile(
    r"^\s*DROP\s+(?:TABLE|(?:MATERIALIZED\s+)?VIEW)\s+(?:IF\s+EXISTS\s+)?([^;]+)", re.I | re.M
)
_CREATES = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+|MATERIALIZED\s+)?(?:INDEX|TRIGGER|VIEW)"
    r"\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)",
    re.I | re.M,
)


def replayq_objects(scripts: Sequence[str]) -> frozenset[str]:
    """The indexes, triggers and views ``scripts`` create (lower case): replayq's, not the
    owner's, told apart by name (replayq's are all named ``rq_...``)."""
    return frozenset(name.lower() for script in scripts for name in _CREATES.findall(script))


def dropped_relations(script: str) -> frozenset[str]:
    """The tables and views ``script`` drops (lower case, as written, without quotes or
    schema: a migration names them through the search path)."""
    names = set()
    for listed in _DROPS.findall(script):
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
