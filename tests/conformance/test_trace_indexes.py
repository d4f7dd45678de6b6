"""The trace's indexes: each query on the trace uses the index kept for it, on both backends.

The trace is stored as packs (``rq_trace``: one row per commit of a job attempt, holding
its events) and ``rq_trace_resources`` (the resources the packs' events name); they keep
only the indexes the trace's queries need (docs/recording-context.md lists each with the
query it serves). Dropping or changing one must fail here, not show up as a full scan
of every event ever recorded. On PostgreSQL sequential scans are disabled
for the check: the tables are empty, and the question is whether an index can serve
the query, not which plan an empty table gets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq
from replayq.storage.protocol import TraceQuery

AppFactory = Callable[..., replayq.App]

RESOURCES_KEY = "the key of rq_trace_resources"

# query name -> (parameters, the indexes its plan must use)
TRACE_QUERIES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "trace_for_job": ({"job_id": 1}, {"rq_trace_job"}),
    "trace_for_jobs": ({"job_ids": [1, 2]}, {"rq_trace_job"}),
    "trace_for_trace": (
        {"trace_id": "replay-0123456789abcdef"},
        {"rq_trace_derived", "rq_jobs_trace", "rq_trace_job"},
    ),
    "trace_for_resource": ({"resource": "order:1"}, {RESOURCES_KEY}),
    "trace_window": (
        {
            "since_hlc": 0,
            "until_hlc": 1 << 40,
            "after_hlc": -1,
            "after_id": 0,
            "job_type": None,
            "version": None,
            "name": None,
            "resource": None,
            "limit": 100,
        },
        {"rq_trace_hlc"},
    ),
    "signal_series": (
        {"names": ["lock.expired"], "since_hlc": 0, "until_hlc": 1 << 40, "bucket_ms": 1000},
        {"rq_trace_hlc"},
    ),
}
# rq_trace_resources is its own key's index: a WITHOUT ROWID table on SQLite, its primary
# key's index on PostgreSQL.
RESOURCES_PLAN = {
    "sqlite": "SEARCH rq_trace_resources USING PRIMARY KEY",
    "postgresql": "rq_trace_resources_pkey",
}


def plan_of(app: replayq.App, name: str, params: dict[str, Any]) -> str:
    storage: Any = app.storage
    sql = storage.queries[name]
    with storage.transaction(readonly=True) as tx:
        conn = tx.connection
        for listed in ("names", "job_ids"):
            if listed in params:
                params = {**params, listed: tx.list_param(params[listed])}
        if storage.dialect == "sqlite":
            rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            return "\n".join(str(row[-1]) for row in rows)
        conn.execute("SET LOCAL enable_seqscan = off")
        return "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, params).fetchall())


def test_every_trace_query_is_served_by_its_index(app_factory: AppFactory) -> None:
    app = app_factory()
    for name, (params, indexes) in TRACE_QUERIES.items():
        plan = plan_of(app, name, params)
        dialect = app.storage.dialect
        wanted = {RESOURCES_PLAN[dialect] if i == RESOURCES_KEY else i for i in indexes}
        missing = {index for index in wanted if index not in plan}
        assert not missing, f"{name} does not use {sorted(missing)}:\n{plan}"
        full_scans = [
            line
            for line in plan.splitlines()
            if line.strip() in ("SCAN rq_trace", "SCAN p", "SCAN rq_trace_resources")
            or "Seq Scan on rq_trace" in line
        ]
        assert not full_scans, f"{name} scans every event:\n{plan}"


def test_the_trace_keeps_only_the_indexes_a_query_needs(app_factory: AppFactory) -> None:
    app = app_factory()
    storage: Any = app.storage
    tables = ("rq_trace", "rq_trace_resources")
    with storage.transaction(readonly=True) as tx:
        if storage.dialect == "sqlite":
            sql = (
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
                " AND tbl_name IN (?, ?)"
            )
        else:
            sql = (
                "SELECT indexname FROM pg_indexes WHERE tablename IN (%s, %s)"
                " AND schemaname = current_schema() AND indexname NOT LIKE '%%pkey'"
            )
        rows = tx.connection.execute(sql, tables).fetchall()
    assert {row[0] for row in rows} == {"rq_trace_job", "rq_trace_derived", "rq_trace_hlc"}


def test_a_jobs_events_are_found_by_its_trace_id_and_a_dry_runs_by_its_own(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        ctx.decide("go", True)

    from replayq.replay.engine import dry_run
    from replayq.testing import run_inline

    job = run_inline(app, "noop", {})
    report = dry_run(app, job.id)
    with app.storage.transaction(readonly=True) as tx:
        own = tx.trace_query(TraceQuery(trace_id=job.trace_id))
        derived = tx.trace_query(TraceQuery(trace_id=report.trace_id))
    assert [e.name for e in own] == [e.name for e in app.trace(job.id)]
    assert "decision" in [e.name for e in derived]
    assert all(e.job_id is None for e in derived)


def test_a_resource_trace_holds_its_versioned_keys_and_nothing_that_only_looks_alike(
    app_factory: AppFactory,
) -> None:
    from replayq.model import TraceEvent

    app = app_factory()
    resources = [
        "price:sku-1",
        "price:sku-1:v3",
        "price:sku-1:v12",
        "price:sku-10",
        "price:sku-1:x",
    ]
    with app.storage.transaction() as tx:
        tx.trace_append(
            [
                TraceEvent(
                    trace_id="replay-resources",
                    name="cache.write",
                    kind="domain",
                    ts=1.0,
                    hlc=n + 1,
                    resource=resource,
                )
                for n, resource in enumerate(resources)
            ]
        )
        found = [e.resource for e in tx.trace_query(TraceQuery(resource="price:sku-1"))]
    assert found == ["price:sku-1", "price:sku-1:v3", "price:sku-1:v12"]
