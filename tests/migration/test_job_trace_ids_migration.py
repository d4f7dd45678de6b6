"""Migration 0028: state versions and effect records written before it answer the trace ids
they answered; written after it, a job's own store none.

Before 0028 every row stored its trace id as given. After it, a row with a job and no
stored trace id answers its job's: an old row with a job and none must still answer none
(0028 marks it X''), an old row's stored trace id is answered as stored (whether or not it
is its job's), and a job-less row is left as it was. Then a write by the same job stores
none, and deleting the job (as gc does) writes its trace id into the rows it leaves.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from replayq.storage.context_params import EntityFilter, EntityGet, IdemClaim, IdemFilter
from replayq.storage.records import EntityRecord
from replayq.storage.sqlite import SqliteStorage
from tests.migration.older import migrated_before, names_from, version_named

JOB_TRACE_IDS = version_named("job_trace_ids")
JOB_TRACE = "0" * 31 + "1"
# key, job_id, trace_id: the job's own, a derived trace's (a fork's write, with the id of
# the job it came from), none with a job, none without one, a rollback's (no job).
ROWS: list[tuple[str, int | None, str | None]] = [
    ("own", 1, JOB_TRACE),
    ("derived", 1, "f" * 32),
    ("none", 1, None),
    ("jobless", None, None),
    ("rollback", None, f"rollback:1:{JOB_TRACE}"),
]
VERSIONS = "SELECT key, job_id, trace_id FROM rq_entity_versions ORDER BY rowid"
RECORDS = "SELECT key, job_id, trace_id FROM rq_idempotency ORDER BY rowid"


def database_before_the_migration(db: Path) -> tuple[list[Any], list[Any]]:
    """Every migration before 0028, a job, and a state version and an effect record of
    each kind above, as replayq wrote them then; both tables' rows as stored."""
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, JOB_TRACE_IDS)
        conn.execute(
            "INSERT INTO rq_jobs (id, job_type, payload, state, run_at, created_at,"
            " max_attempts, trace_id, finished_at) VALUES (1, 't', '{}', 'succeeded', 0, 0,"
            " 1, ?, 1)",
            (JOB_TRACE,),
        )
        for n, (key, job_id, trace_id) in enumerate(ROWS, start=1):
            conn.execute(
                "INSERT INTO rq_entity_versions (branch, namespace, key, version, data, delta,"
                " job_id, trace_id, attempt, created_at, hlc)"
                " VALUES ('main', 'n', ?, 1, '{}', 'null', ?, ?, 1, 0, ?)",
                (key, job_id, trace_id, n),
            )
            conn.execute(
                "INSERT INTO rq_entities (branch, namespace, key, version, hlc)"
                " VALUES ('main', 'n', ?, 1, ?)",
                (key, n),
            )
            conn.execute(
                "INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at,"
                " trace_id, job_id, attempt) VALUES (?, 'op', 'started', 'c', ?, ?, ?, 1)",
                (key, n, trace_id, job_id),
            )
        stored = conn.execute(VERSIONS).fetchall(), conn.execute(RECORDS).fetchall()
    conn.close()
    return stored


def answers(storage: SqliteStorage) -> dict[str, tuple[Any, ...]]:
    """Each key's trace id as every read answers it: the head, the version, by job, after
    a version; the record by key, by job, in the list."""
    found: dict[str, tuple[Any, ...]] = {}
    with storage.transaction(readonly=True) as tx:
        by_job = {v.key: v.trace_id for v in tx.entity_list(EntityFilter(job_id=1))}
        records_by_job = {r.key: r.trace_id for r in tx.idem_list(IdemFilter(job_id=1))}
        listed = {r.key: r.trace_id for r in tx.idem_list(IdemFilter(limit=100))}
        for key, job_id, _ in ROWS:
            head = tx.entity_get(EntityGet("main", "n", key))
            version = tx.entity_get(EntityGet("main", "n", key, version=1))
            (after,) = tx.entity_list(EntityFilter(branch="main", namespace="n", key=key))
            (record,) = tx.idem_list(IdemFilter(key=key))
            assert head is not None and version is not None
            found[key] = (
                head.trace_id,
                version.trace_id,
                after.trace_id,
                record.trace_id,
                listed[key],
            )
            if job_id is not None:
                found[key] += (by_job[key], records_by_job[key])
    return found


def test_rows_written_before_answer_their_trace_ids_and_a_jobs_new_rows_store_none(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    versions_before, records_before = database_before_the_migration(db)
    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        applied = [s.name for s in storage.migrate(now=0.0)]
        assert applied == names_from(version_named("job_trace_ids"))
        # As every read answered before: the trace id as stored.
        expected = {
            key: (trace_id,) * (7 if job_id is not None else 5) for key, job_id, trace_id in ROWS
        }
        assert answers(storage) == expected

        # A new write of the job in its own trace, and a claim: no trace id stored.
        with storage.transaction() as tx:
            row = EntityRecord(
                "main", "n", "new", 1, None, "{}", None, "null", 1, JOB_TRACE, 1, None, 0.0, 9
            )
            assert tx.entity_put(row, 0)
            assert tx.idem_transition(IdemClaim("new", "op", "c", 9.0, JOB_TRACE, 1, 1))
            version = tx.entity_get(EntityGet("main", "n", "new"))
            assert version is not None and version.trace_id == JOB_TRACE
    finally:
        storage.close()

    conn = sqlite3.connect(db)
    try:
        # Only the rows with a job and none changed: X'' (none, never the job's).
        marked = [
            (key, job_id, b"" if (job_id, trace_id) == (1, None) else trace_id)
            for key, job_id, trace_id in versions_before
        ]
        assert conn.execute(VERSIONS).fetchall() == [*marked, ("new", 1, None)]
        marked = [
            (key, job_id, b"" if (job_id, trace_id) == (1, None) else trace_id)
            for key, job_id, trace_id in records_before
        ]
        assert conn.execute(RECORDS).fetchall() == [*marked, ("new", 1, None)]
        # The job deleted (as gc deletes it): its trace id goes into the rows that stored none.
        with conn:
            conn.execute("DELETE FROM rq_jobs WHERE id = 1")
        for sql in (VERSIONS, RECORDS):
            assert conn.execute(sql).fetchall()[-1] == ("new", 1, JOB_TRACE)
            assert dict((k, t) for k, _, t in conn.execute(sql))["none"] == b""
    finally:
        conn.close()

    storage = SqliteStorage(f"sqlite:///{db}")
    try:
        assert answers(storage) == expected
        with storage.transaction(readonly=True) as tx:
            version = tx.entity_get(EntityGet("main", "n", "new"))
            assert version is not None and version.trace_id == JOB_TRACE
    finally:
        storage.close()
