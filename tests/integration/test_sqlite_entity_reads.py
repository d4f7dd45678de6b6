"""SQLite reads an entity's current version in one statement (the head joined to its
version row, ``entity_head_version``): the same record as the head read and then the
version read, each table searched by its whole key (and its job's row by id, for the trace
id a job's version does not store), and nothing for an entity that has no head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replayq.storage import open_storage
from replayq.storage.context_params import EntityGet
from replayq.storage.context_verbs import record
from replayq.storage.records import EntityRecord

T0 = 1_700_000_000.0


def two_step_read(tx: Any, query: EntityGet) -> EntityRecord | None:
    """An entity's current version read as two statements: its head, then its version row."""
    where = {"branch": query.branch, "namespace": query.namespace, "key": query.key}
    head = tx.fetchone("entity_head", where)
    if head is None:
        return None
    row = tx.fetchone("entity_version_get", {**where, "version": int(head["version"])})
    return None if row is None else record(EntityRecord, row)


def test_an_entitys_current_version_is_one_statement_and_the_two_step_reads_answer(
    tmp_path: Path,
) -> None:
    import replayq

    url = f"sqlite:///{tmp_path / 'state.db'}"
    app = replayq.App(url)
    try:
        app.state.put("account", 1, {"balance": 10}, expected_version=0)
        app.state.put("account", 1, {"balance": 7}, expected_version=1)
        app.state.put("account", 2, {"balance": 3}, expected_version=0)
    finally:
        app.close()
    storage = open_storage(url)
    try:
        with storage.transaction(readonly=True) as tx:
            statements: list[str] = []
            tx.connection.set_trace_callback(statements.append)
            for key in ("1", "2", "3"):
                query = EntityGet("main", "account", key)
                statements.clear()
                joined = tx.entity_get(query)
                assert len(statements) == 1, statements
                # The two-step read: the head, then the version it names.
                assert joined == two_step_read(tx, query)
                if key == "3":
                    assert joined is None
                else:
                    assert joined is not None and joined.data is not None
            current = tx.entity_get(EntityGet("main", "account", "1"))
            assert current is not None and (current.version, current.data) == (2, '{"balance":7}')
            tx.connection.set_trace_callback(None)
            sql = storage.queries["entity_head_version"]  # type: ignore[attr-defined]
            plan = " ".join(
                str(row[3])
                for row in tx.connection.execute(
                    "EXPLAIN QUERY PLAN " + sql,
                    {"branch": "main", "namespace": "account", "key": "1"},
                )
            )
            # Each table by its whole key: rq_entities' primary key, rq_entity_versions',
            # and (a version that stores no trace id, migration 0028) its job's row's.
            assert "SCAN" not in plan and plan.count("SEARCH") == 3, plan
            assert "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
            assert "(branch=? AND namespace=? AND key=?)" in plan, plan
            assert "(branch=? AND namespace=? AND key=? AND version=?)" in plan, plan
    finally:
        storage.close()
