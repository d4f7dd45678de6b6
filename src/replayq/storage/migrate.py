"""Versioned schema migrations, shared numbering across backends (``NNNN_name.sql``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replayq.errors import SchemaError
from replayq.storage.protocol import MigrationStatus
from replayq.storage.queries import load_migrations


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
