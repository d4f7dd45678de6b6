"""Migration 0009 converts a trace recorded one row per event into packs, on both backends.

The database is built with migrations 0001 to 0008 as an older replayq left it, with
events of a job (lifecycle and domain, one naming a resource) and of a derived trace;
opening it with this replayq applies 0009, and every reader returns the same events.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

import replayq
from replayq.model import TraceEvent
from replayq.storage.postgres import parse_postgres_url
from replayq.storage.protocol import TraceQuery
from replayq.storage.queries import load_migrations

OLD = [
    # (trace_id, job_id, attempt, kind, name, seq, step, ts, hlc, worker_id, status,
    #  resource, resource_version, side_effect, output_ref, data)
    (
        "t-1",
        1,
        None,
        "lifecycle",
        "job.enqueued",
        None,
        None,
        10.25,
        100,
        None,
        "queued",
        None,
        None,
        0,
        None,
        {"priority": 0},
    ),
    (
        "t-1",
        1,
        1,
        "domain",
        "state.read",
        1,
        "load",
        11.5,
        102,
        "w1",
        None,
        "order:1",
        3,
        0,
        None,
        {"exists": True},
    ),
    (
        "t-1",
        1,
        1,
        "domain",
        "effect.succeeded",
        2,
        "charge",
        11.75,
        101,
        "w1",
        "success",
        "charge:1",
        None,
        1,
        "blob:sha256:00",
        {"result": {"ok": [1, 2.5, None]}},
    ),
    (
        "replay-1",
        None,
        1,
        "domain",
        "decision",
        1,
        None,
        12.0,
        103,
        "replay",
        None,
        None,
        None,
        0,
        None,
        {"decision": "go", "value": True},
    ),
]
INSERT = (
    "INSERT INTO rq_events (trace_id, job_id, attempt, kind, name, seq, step, ts, hlc,"
    " worker_id, status, resource, resource_version, side_effect, output_ref, data)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def old_database(url: str, dialect: str) -> None:
    """Migrations 0001 to 0008 applied and recorded, then the old events inserted."""
    package = f"replayq.storage.{dialect}.migrations"
    scripts = [(v, n, sql) for v, n, sql in load_migrations(package) if v <= 8]
    rows = [(*row[:-1], json.dumps(row[-1])) for row in OLD]
    if dialect == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        with conn:
            conn.execute(
                "CREATE TABLE rq_schema_migrations (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            for version, name, sql in scripts:
                conn.executescript(sql)
                conn.execute("INSERT INTO rq_schema_migrations VALUES (?, ?, 0)", (version, name))
            conn.executemany(INSERT.replace("%s", "?"), rows)
        conn.close()
        return
    conninfo, _ = parse_postgres_url(url)
    with psycopg.connect(conninfo) as pg:
        pg.execute(
            "CREATE TABLE rq_schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for version, name, sql in scripts:
            pg.execute(sql)
            pg.execute("INSERT INTO rq_schema_migrations VALUES (%s, %s, 0)", (version, name))
        with pg.cursor() as cur:
            cur.executemany(INSERT, rows)


def fields(event: TraceEvent) -> tuple[Any, ...]:
    return (
        event.trace_id, event.job_id, event.attempt, event.kind, event.name, event.seq,
        event.step, event.ts, event.hlc, event.worker_id, event.status, event.resource,
        event.resource_version, int(event.side_effect), event.output_ref, event.data,
    )  # fmt: skip


@pytest.mark.parametrize(
    "dialect", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_events_recorded_one_row_each_read_back_the_same_after_0009(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = str(request.getfixturevalue("pg_schema_url"))
    old_database(url, dialect)

    app = replayq.App(url, auto_migrate=True)
    try:
        with app.storage.transaction(readonly=True) as tx:
            job = tx.trace_query(TraceQuery(job_id=1))
            derived = tx.trace_query(TraceQuery(trace_id="replay-1"))
            order = tx.trace_query(TraceQuery(resource="order:1"))
            view = tx.connection.execute(
                "SELECT name, hlc, resource FROM rq_events ORDER BY hlc, id"
            ).fetchall()
        by_hlc = sorted(OLD, key=lambda row: row[8])
        assert [fields(e) for e in job] == [row for row in by_hlc if row[1] == 1]
        assert [fields(e) for e in derived] == [row for row in OLD if row[0] == "replay-1"]
        assert [e.name for e in order] == ["state.read"]
        assert [tuple(r) for r in view] == [(row[4], row[8], row[11]) for row in by_hlc]

        # What is recorded afterwards is packed and sorts after the converted events.
        with app.storage.transaction() as tx:
            leased = TraceEvent(
                trace_id="t-1", job_id=1, attempt=2, name="job.leased", ts=20.0, hlc=200
            )
            tx.trace_append([leased])
            names = [e.name for e in tx.trace_query(TraceQuery(job_id=1))]
        assert names == ["job.enqueued", "effect.succeeded", "state.read", "job.leased"]
    finally:
        app.close()
