"""Keeping replay apart from production: tagged and linked derived traces, their own state
branches, no outbox rows or child jobs from a dry-run or fork, and production listings that
leave derived jobs out."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import replayq
from replayq.recording.state import StateStore
from replayq.replay.engine import dry_run, fork
from replayq.replay.rerun import rerun
from tests.apps import replay_shop
from tests.context_support import count_rows
from tests.replay_support import cli_ok, derived_events, lineage_of_job, record
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_derived_traces_are_tagged_with_their_origin_and_point_to_the_original(
    app: replayq.App, service: Service
) -> None:
    job = record(app)

    replayed = dry_run(app, job.id)
    forked = fork(app, job.id, from_step="apply", version="v2")
    rerun_report = rerun(app, job.id, allow_effects=["email.send"])

    rows = lineage_of_job(app, job)
    assert {row["trace_id"]: row["origin"] for row in rows} == {
        replayed.trace_id: "replay",
        forked.trace_id: "fork",
        rerun_report.trace_id: "rerun",
    }
    assert {(row["source_job_id"], row["source_trace_id"]) for row in rows} == {
        (job.id, job.trace_id)
    }
    for trace_id in (replayed.trace_id, forked.trace_id, rerun_report.trace_id):
        events = derived_events(app, trace_id)
        assert events, trace_id
        assert all(e.job_id is None for e in events), "derived events stay off the job's timeline"
    assert {e.trace_id for e in app.trace(job.id)} == {job.trace_id}


def test_dry_run_and_fork_write_state_on_their_own_branch(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    # Production moves on after the job; replays must neither see nor disturb it.
    app.state.put("order", 1, {**replay_shop.ORDER, "status": "delivered"}, expected_version=2)
    production = app.state.get("order", 1)
    production_history = app.state.history("order", 1)

    replayed = dry_run(app, job.id)
    forked = fork(app, job.id, from_step="decide", version="v2")

    assert app.state.get("order", 1) == production
    assert app.state.history("order", 1) == production_history
    for report, status in ((replayed, "shipped"), (forked, "backordered")):
        branch = StateStore(app, report.branch)
        own = branch.get("order", 1)
        # The branch read through to the snapshot (v1) and wrote its own v2 on top of it.
        assert (own.version, own.data["status"]) == (2, status)
        assert [(v.version, v.branch) for v in branch.history("order", 1)] == [(2, report.branch)]
        with app.storage.transaction(readonly=True) as tx:
            info = tx.branch_get(report.branch)
        assert info is not None
        assert (info.base_branch, info.origin) == ("main", report.mode)
    assert replayed.branch.startswith("replay:") and forked.branch.startswith("fork:")


def test_dry_run_and_fork_create_no_outbox_rows_and_no_child_jobs(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    outbox_rows, job_rows = count_rows(app.url, "rq_outbox"), count_rows(app.url, "rq_jobs")
    assert (outbox_rows, job_rows) == (1, 2), "production wrote one outbox row and one child"

    replayed = dry_run(app, job.id)
    forked = fork(app, job.id, from_step="apply", version="v2")

    assert count_rows(app.url, "rq_outbox") == outbox_rows
    assert count_rows(app.url, "rq_jobs") == job_rows
    for report in (replayed, forked):
        names = [e.name for e in derived_events(app, report.trace_id)]
        assert "outbox.written" in names and "child.enqueued" in names, "intent is recorded"


def test_jobs_list_and_stats_leave_out_jobs_of_derived_runs(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    rerun(app, job.id, allow_effects=["email.send"])
    everything = app.list_jobs(origin=None)
    [rerun_child] = [j for j in everything if j.origin == "rerun"]
    assert rerun_child.job_type == "send_receipt"
    production_ids = {j.id for j in everything if j.origin == "production"}

    listed = json.loads(cli_ok(app.url, "jobs", "list", "--json").stdout)
    listed_all = json.loads(cli_ok(app.url, "jobs", "list", "--all-origins", "--json").stdout)
    stats = json.loads(cli_ok(app.url, "stats", "--json").stdout)

    assert {row["id"] for row in listed} == production_ids
    assert {row["id"] for row in listed_all} == production_ids | {rerun_child.id}
    assert {(row["job_type"], row["state"]): row["count"] for row in stats} == {
        ("send_receipt", "queued"): 1,
        ("ship_order", "succeeded"): 1,
    }
