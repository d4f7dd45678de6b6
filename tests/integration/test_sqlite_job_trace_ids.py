"""SQLite keeps no copy of a job's trace id in its state versions and effect records
(migration 0028), and every read still answers it.

A row written in its job's own trace stores NULL for its trace id; the reads answer the
job's (``rq_jobs.trace_id``). A derived trace's row (a fork's write on its branch, job id
of the job it came from) keeps its own, a row with a job and no trace id answers none,
and when gc deletes a job the rows it leaves (state versions, a record still in doubt)
get its trace id written in, so they answer it ever after. PostgreSQL stores every trace
id; the conformance suite checks the answers there (``test_context_state``,
``test_context_effects``).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import replayq
from replayq.replay.engine import fork
from replayq.storage.context_params import (
    EntityFilter,
    EntityGet,
    IdemClaim,
    IdemFilter,
    IdemTakeover,
)
from replayq.storage.protocol import idem_get
from replayq.storage.records import EntityRecord
from replayq.testing import run_inline
from tests.apps import retained
from tests.replay_support import cli_ok

DAY = 86_400.0
START = 1_700_000_000.0


def stored(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows as the file holds them, read with a plain connection."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def stored_trace_ids(url: str, table: str, job_id: int) -> list[Any]:
    sql = f"SELECT trace_id FROM {table} WHERE job_id = ? ORDER BY rowid"  # noqa: S608
    return [trace_id for (trace_id,) in stored(url, sql, job_id)]


def test_a_jobs_versions_and_records_store_no_trace_id_and_every_read_answers_the_jobs(
    sqlite_url: str,
) -> None:
    app = retained.declare(replayq.App(sqlite_url, clock=replayq.FrozenClock(START)))
    try:
        jobs = [run_inline(app, "credit", {"account": "a", "amount": n}) for n in (1, 2)]
        for job in jobs:
            assert stored_trace_ids(sqlite_url, "rq_entity_versions", job.id) == [None]
            assert stored_trace_ids(sqlite_url, "rq_idempotency", job.id) == [None]

        traces = [job.trace_id for job in jobs]
        history = app.state.history("account", "a")
        assert [(v.job_id, v.trace_id) for v in history] == [(j.id, j.trace_id) for j in jobs]
        effects = {e.key: e.trace_id for e in app.effects(limit=10)}
        assert effects == {f"notify:a:{j.id}": j.trace_id for j in jobs}
        with app.storage.transaction(readonly=True) as tx:
            # Every read of a version: the head, a version, at an HLC, by job, after a version.
            head = tx.entity_get(EntityGet("main", "account", "a"))
            first = tx.entity_get(EntityGet("main", "account", "a", version=1))
            assert head is not None and first is not None
            at = tx.entity_get(EntityGet("main", "account", "a", at_hlc=first.hlc))
            assert [head.trace_id, first.trace_id, at and at.trace_id] == traces[::-1] + traces[:1]
            for job in jobs:
                (by_job,) = tx.entity_list(EntityFilter(job_id=job.id))
                assert by_job.trace_id == job.trace_id
                (record,) = tx.idem_list(IdemFilter(job_id=job.id))
                assert record.trace_id == job.trace_id
                got = idem_get(tx, f"notify:a:{job.id}")
                assert got is not None and got.trace_id == job.trace_id
            after = tx.entity_list(EntityFilter(branch="main", namespace="account", key="a"))
            assert [v.trace_id for v in after] == traces
            listed = tx.idem_list(IdemFilter(operation="ledger.notify"))
            assert sorted(r.trace_id for r in listed if r.trace_id) == sorted(traces)
        # The CLI, another process, from the file.
        shown = json.loads(cli_ok(sqlite_url, "state", "history", "account", "a", "--json").stdout)
        assert [v["trace_id"] for v in shown] == traces
    finally:
        app.close()


def test_a_forks_write_keeps_its_derived_trace_id_beside_the_jobs_id(sqlite_url: str) -> None:
    app = retained.declare(replayq.App(sqlite_url, clock=replayq.FrozenClock(START)))
    try:
        job = run_inline(app, "credit", {"account": "a", "amount": 1})
        report = fork(app, job.id, from_step="credit")
        assert report.branch is not None and report.trace_id != job.trace_id
        rows = stored(
            sqlite_url,
            "SELECT branch, job_id, trace_id FROM rq_entity_versions ORDER BY rowid",
        )
        assert rows == [("main", job.id, None), (report.branch, job.id, report.trace_id)]
        with app.storage.transaction(readonly=True) as tx:
            on_branch = tx.entity_get(EntityGet(report.branch, "account", "a"))
            assert on_branch is not None
            assert (on_branch.job_id, on_branch.trace_id) == (job.id, report.trace_id)
            by_job = tx.entity_list(EntityFilter(job_id=job.id))
            assert [(v.branch, v.trace_id) for v in by_job] == [
                ("main", job.trace_id),
                (report.branch, report.trace_id),
            ]
    finally:
        app.close()


def test_a_row_with_a_job_and_no_trace_id_answers_none_and_a_takeover_stores_as_a_claim(
    sqlite_url: str,
) -> None:
    app = retained.declare(replayq.App(sqlite_url, clock=replayq.FrozenClock(START)))
    try:
        job = run_inline(app, "credit", {"account": "a", "amount": 1})
        other = run_inline(app, "credit", {"account": "b", "amount": 1})
        row = EntityRecord(
            "main", "imported", "1", 1, None, '{"n":1}', None, "null",
            job.id, None, 1, None, START, 1,
        )  # fmt: skip
        with app.storage.transaction() as tx:
            assert tx.entity_put(row, 0)
            claim = IdemClaim("k", "op", "c1", START, None, job.id, 1)
            assert tx.idem_transition(claim)
            derived = IdemClaim("d", "op", "c2", START, "a-derived-trace", job.id, 1)
            assert tx.idem_transition(derived)
        assert stored(
            sqlite_url,
            "SELECT key, typeof(trace_id), trace_id FROM rq_idempotency"
            " WHERE key IN ('k', 'd') ORDER BY key",
        ) == [("d", "text", "a-derived-trace"), ("k", "blob", b"")]
        assert stored(
            sqlite_url, "SELECT typeof(trace_id) FROM rq_entity_versions WHERE key = '1'"
        ) == [("blob",)]
        with app.storage.transaction() as tx:
            imported = tx.entity_get(EntityGet("main", "imported", "1"))
            assert imported is not None and (imported.job_id, imported.trace_id) == (job.id, None)
            records = {r.key: r.trace_id for r in tx.idem_list(IdemFilter(job_id=job.id))}
            assert records["k"] is None and records["d"] == "a-derived-trace"
            # Taken over by the other job in its own trace: its trace id is not stored.
            takeover = IdemTakeover("k", "c3", START, other.trace_id, other.id, 1, "started", "c1")
            assert tx.idem_transition(takeover)
            got = idem_get(tx, "k")
            assert got is not None and (got.job_id, got.trace_id) == (other.id, other.trace_id)
        assert stored(sqlite_url, "SELECT trace_id FROM rq_idempotency WHERE key = 'k'") == [
            (None,)
        ]
    finally:
        app.close()


def test_gc_deleting_a_job_writes_its_trace_id_into_the_versions_and_records_it_leaves(
    sqlite_url: str,
) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        replayq.App(
            sqlite_url,
            clock=clock,
            retention=replayq.Retention(full_days=1, ledger_days=2),
        )
    )
    try:
        gone = run_inline(app, "credit", {"account": "a", "amount": 1})
        # An effect record left in doubt by the job (gc keeps those): started, never settled.
        with app.storage.transaction() as tx:
            claim = IdemClaim("in-doubt", "op", "c", START, gone.trace_id, gone.id, 1)
            assert tx.idem_transition(claim)
        assert stored_trace_ids(sqlite_url, "rq_idempotency", gone.id) == [None, None]
        clock.advance(3 * DAY)
        kept = run_inline(app, "credit", {"account": "a", "amount": 2})

        assert app.gc().purged_jobs == 1

        assert stored(sqlite_url, "SELECT COUNT(*) FROM rq_jobs WHERE id = ?", gone.id) == [(0,)]
        assert stored_trace_ids(sqlite_url, "rq_entity_versions", gone.id) == [gone.trace_id]
        # Its settled record too (no idempotency_days: kept) and the one in doubt.
        assert stored_trace_ids(sqlite_url, "rq_idempotency", gone.id) == [gone.trace_id] * 2
        assert stored_trace_ids(sqlite_url, "rq_entity_versions", kept.id) == [None]
        history = app.state.history("account", "a")
        assert [(v.job_id, v.trace_id) for v in history] == [
            (gone.id, gone.trace_id),
            (kept.id, kept.trace_id),
        ]
        with app.storage.transaction(readonly=True) as tx:
            records = {r.key: r.trace_id for r in tx.idem_list(IdemFilter(job_id=gone.id))}
            assert records == {f"notify:a:{gone.id}": gone.trace_id, "in-doubt": gone.trace_id}
    finally:
        app.close()


def test_a_database_file_keeps_its_trace_ids_readable_by_path(tmp_path: Path) -> None:
    """The same file opened again by a new App (a new process's view): the answers come
    from the file, not from anything the writer kept."""
    url = f"sqlite:///{tmp_path / 'again.db'}"
    app = retained.declare(replayq.App(url, clock=replayq.FrozenClock(START)))
    try:
        job = run_inline(app, "credit", {"account": "a", "amount": 1})
    finally:
        app.close()
    again = replayq.App(url)
    try:
        (version,) = again.state.history("account", "a")
        assert version.trace_id == job.trace_id
        assert stored_trace_ids(url, "rq_entity_versions", job.id) == [None]
    finally:
        again.close()
