"""One PostgreSQL migration at a time, keeping what the database's owner hung on its tables.

A migration that drops a table or a view (0009 drops the table ``rq_events`` to put a view
of that name in its place) drops with it, without a word, its indexes, triggers, rules,
policies and statistics objects, replayq's and the owner's alike; the objects of other
relations that read or reference it (a view, a foreign key) make PostgreSQL refuse the
drop, or go along with ``CASCADE``. replayq's own the migration makes again. The owner's
(an object whose name replayq's migrations do not create, a column no word of their SQL
names: ``migrate.ReplayqNames``):

* an index, trigger or rule on the dropped relation is made again from its definition
  (``pg_get_indexdef``, ``pg_get_triggerdef``, ``pg_get_ruledef``, read before the script)
  once the script is done, in the same transaction: so it serves, or fires for, what is
  written after the upgrade. When the relation of that name is of another kind now (0009:
  a view where a table was), or PostgreSQL cannot make it again, the upgrade is refused,
  naming it: on a view such an object could not be made, or would never fire, since
  replayq writes no rows to a view. The privileges granted on the dropped relation are
  granted again on what takes its name, whatever its kind (a reader of the table reads
  the view). A column of the owner's on a dropped table that what takes its name has not
  refuses the upgrade: the migration copies the columns it knows;
* a policy or statistics object on it, or a view, rule, foreign key or other object of
  the owner's that depends on it, refuses the upgrade before the script runs, naming it:
  replayq drops none of the owner's (with ``CASCADE`` PostgreSQL would, silently). Any
  other refusal of PostgreSQL's for a dependent object (SQLSTATE 2BP01: a foreign key on
  the unique constraint 0011 drops, a function taking the dropped table's row type) is a
  ``SchemaError`` too, with PostgreSQL's own list of the objects; so is its refusal to
  alter the type of a column (0026: ``rq_blobs.hash``) that an object of the owner's
  depends on: a view or rule reading it (SQLSTATE 0A000), a foreign key to it (42804), an
  index with a text operator class (42704) or on a text function of it (42883).

The upgrade is one transaction (DDL is transactional here): a refusal changes nothing.
Names resolve through the search path, as the migration's own statements do, so a
replayq installed in its own schema keeps its owner's objects there.
"""

from __future__ import annotations

from typing import Any

import psycopg

from replayq.errors import SchemaError
from replayq.storage import migrate
from replayq.storage.sql_transaction import SqlTransaction

# A relation's kind as a message names it (a partitioned table is a table here).
_RELKINDS = {"r": "table", "v": "view", "m": "materialized view"}
# Of the relation, and dropped with it; every other kind reads or references it.
_ON_THE_RELATION = frozenset(
    {"index", "trigger", "rule", "privileges", "policy", "statistics object"}
)


def run_migration(tx: SqlTransaction, script: str, replayq: migrate.ReplayqNames) -> None:
    """Run one migration's ``script`` in ``tx``'s transaction and keep the owner's objects
    on the relations it drops, or refuse the upgrade naming them (see the module)."""
    dropped = migrate.dropped_relations(script)
    kept: list[dict[str, Any]] = []
    if dropped:
        found = tx.fetchall("migration_dependents", {"relations": sorted(dropped)})
        for obj in found:
            if replayq.made(obj["kind"], obj["name"]):
                continue
            if obj["definition"] is None:
                raise _refused(obj, _why_not_kept(obj))
            kept.append(obj)
    try:
        tx.connection.execute(script)  # no parameters: one simple query, the whole script
    except (
        psycopg.errors.DependentObjectsStillExist,
        psycopg.errors.FeatureNotSupported,
        psycopg.errors.DatatypeMismatch,
        psycopg.errors.UndefinedObject,
        psycopg.errors.UndefinedFunction,
    ) as exc:
        # A column whose type the script alters (0026, rq_blobs.hash) that an object of the
        # owner's depends on: a view or rule reading it (FeatureNotSupported), a foreign
        # key to it (DatatypeMismatch), an index with a text operator class
        # (UndefinedObject) or on a text function of it (UndefinedFunction); PostgreSQL
        # names it in its message or detail.
        detail = (exc.diag.message_detail or "").replace("\n", "; ")
        raise SchemaError(
            f"PostgreSQL refuses it: {exc.diag.message_primary} ({detail}); replayq drops "
            f"none of yours. Nothing was changed: drop them, upgrade, then create what "
            f"still applies"
        ) from exc
    for obj in kept:
        now = tx.fetchone("migration_dependent_kept", obj)
        if now["present"]:
            continue  # the script did not drop it after all
        if obj["kind"] == "column":
            raise migrate.owner_column_refused(obj["name"], obj["relation"])
        if obj["kind"] == "privileges":
            if now["relkind"] is None:
                continue  # nothing takes the name: nothing to grant them on
        elif now["relkind"] != obj["relkind"]:
            raise _refused(obj, _why_other_kind(obj, now["relkind"]))
        try:
            tx.connection.execute(obj["definition"])
        except psycopg.Error as exc:
            why = (
                f"this upgrade drops {obj['relation']!r} and cannot make the {obj['kind']} "
                f"again after it ({exc.diag.message_primary or exc})"
            )
            raise _refused(obj, why) from exc


def _refused(obj: dict[str, Any], why: str) -> SchemaError:
    on = "on" if obj["kind"] in _ON_THE_RELATION else "depending on"
    what = f"{obj['kind']} {obj['name']!r} {on} {obj['relation']!r}"
    return migrate.owner_object_refused(what, why, obj["dropped"])


def _why_not_kept(obj: dict[str, Any]) -> str:
    if obj["kind"] in _ON_THE_RELATION:
        return f"this upgrade drops {obj['relation']!r}, and the {obj['kind']} with it"
    return (
        f"this upgrade drops {obj['relation']!r}, which PostgreSQL refuses while it depends "
        f"on it (or, with CASCADE, drops it along)"
    )


def _why_other_kind(obj: dict[str, Any], relkind: str | None) -> str:
    was = _RELKINDS.get(obj["relkind"], "relation")
    if relkind is None:
        return f"this upgrade drops the {was} {obj['relation']!r} and makes none in its place"
    now = _RELKINDS.get(relkind, "relation")
    why = f"this upgrade puts a {now} in the place of the {was} {obj['relation']!r}"
    if relkind != "v":
        return why
    if obj["kind"] == "index":
        return f"{why}, and a view has no rows of its own to index"
    return f"{why}, where the {obj['kind']} would never fire: replayq writes no rows to a view"
