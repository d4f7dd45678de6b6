"""Forked re-execution: branch the state before a step, run another version, diff; production
state and the real service stay untouched."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import replayq
from replayq import codec
from replayq.recording.state import StateStore
from replayq.replay.diff import diff_traces
from replayq.replay.engine import fork
from replayq.replay.recorded import Outcome
from replayq.storage.protocol import BranchCreate
from tests.apps import replay_shop
from tests.replay_support import APP_SPEC, cli_ok, derived_events, lineage, record, record_dead
from tests.services import Service

AppFactory = Callable[..., replayq.App]
# v2 backorders, so it emails under a key the v1 recording never used: the fork must be told.
EMAIL_STUB = {"email.send": {"message_id": "stub"}}


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_fork_from_a_middle_step_leaves_production_alone_and_links_to_the_original(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    head_before = app.state.get("order", 1)
    history_before = app.state.history("order", 1)
    job_trace_before = app.trace(job.id)
    before = service.counts()

    report = fork(app, job.id, from_step="decide", version="v2", stubs=EMAIL_STUB)

    assert service.counts() == before
    assert app.state.get("order", 1) == head_before
    assert app.state.history("order", 1) == history_before
    assert app.trace(job.id) == job_trace_before, "the fork's events are not the job's"
    assert report.reached_fork is True
    assert report.outcome_now == Outcome(
        "succeeded", result={"status": "backordered", "shipment_id": None}
    )
    on_branch = StateStore(app, report.branch).get("order", 1)
    assert on_branch.data["status"] == "backordered"
    link = lineage(app, report.trace_id)
    assert link["origin"] == "fork"
    assert link["source_trace_id"] == job.trace_id
    assert link["source_job_id"] == job.id
    assert link["branch"] == report.branch
    details = codec.loads(link["details"])
    assert details["fork_step"] == "decide"
    assert details["version"] == "v2"
    fork_events = derived_events(app, report.trace_id)
    assert fork_events and all(e.job_id is None for e in fork_events)
    assert {e.trace_id for e in app.trace(job.id)} == {job.trace_id}


def test_fork_diff_shows_exactly_the_changed_fields_and_effect_intent(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    shipment_id = job.result["shipment_id"]
    before = service.counts()

    report = fork(app, job.id, from_step="decide", version="v2", stubs=EMAIL_STUB)
    diff = diff_traces(app, str(job.id), report.trace_id)
    shown = json.loads(cli_ok(app.url, "diff", str(job.id), report.trace_id, "--json").stdout)

    assert service.counts() == before
    assert diff.state == [
        {"resource": "order:1", "field": "shipment_id", "a": shipment_id, "b": None},
        {"resource": "order:1", "field": "status", "a": "shipped", "b": "backordered"},
    ]
    assert diff.decisions == [{"decision": "ship", "a": [True], "b": [False]}]
    assert diff.effects == [
        {"effect": "email.send [email:1:backordered]", "a": {}, "b": {"succeeded": 1}},
        {"effect": "email.send [email:1:shipped]", "a": {"succeeded": 1}, "b": {}},
        {"effect": "warehouse.ship [ship:1]", "a": {"succeeded": 1}, "b": {}},
    ]
    assert diff.outcome == {"a": "succeeded", "b": "succeeded"}
    assert not diff.identical
    assert shown["state"] == diff.state
    assert shown["effects"] == diff.effects


def test_fork_of_the_same_version_diffs_as_identical(app: replayq.App, service: Service) -> None:
    job = record(app)

    report = fork(app, job.id, from_step="apply")

    assert diff_traces(app, str(job.id), report.trace_id).identical


def test_fork_override_changes_the_payload_of_the_fork_only(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    head_before = app.state.get("order", 1)
    before = service.counts()

    shown = cli_ok(
        app.url,
        "fork",
        str(job.id),
        "--from-step",
        "apply",
        "--override",
        "shipping=express",
        "--app",
        APP_SPEC,
        "--json",
    ).stdout
    report = json.loads(shown)

    assert service.counts() == before
    assert app.get_job(job.id).payload == {"order_id": 1}
    assert app.state.get("order", 1) == head_before
    assert codec.loads(lineage(app, report["trace_id"])["details"])["overrides"] == {
        "shipping": "express"
    }
    diff = diff_traces(app, str(job.id), report["trace_id"])
    assert diff.state == [
        {"resource": "order:1", "field": "shipping", "a": "standard", "b": "express"}
    ]
    assert diff.effects == [] and diff.decisions == []
    assert StateStore(app, report["branch"]).get("order", 1).data["shipping"] == "express"


def test_fork_from_a_step_the_recording_lacks_is_refused_naming_the_steps(
    app: replayq.App, service: Service
) -> None:
    job = record(app)

    with pytest.raises(replayq.ConfigurationError, match=r"no step 'ship_it'.*check_stock"):
        fork(app, job.id, from_step="ship_it")


def test_fork_of_a_failed_attempt_with_a_stub_shows_the_fix_without_real_calls(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email")
    job = record_dead(app)
    before = service.counts()

    report = fork(app, job.id, from_step="notify", stubs={"email.send": {"message_id": "stub"}})
    diff = diff_traces(app, str(job.id), report.trace_id)

    assert service.counts() == before
    assert report.outcome_recorded.status == "failed"
    assert report.outcome_now == Outcome(
        "succeeded", result={"status": "shipped", "shipment_id": "shp-1"}
    )
    assert diff.outcome == {
        "a": "dead (not_retryable) [unknown]: HTTPError: HTTP Error 503: Service Unavailable",
        "b": "succeeded",
    }
    assert diff.state == []


def test_a_write_from_outside_a_job_on_a_branch_starts_its_head_there(app: replayq.App) -> None:
    """``StateStore(app, branch).put`` (seeding or repairing a fork's branch by hand): an
    entity the branch still reads through to its base is written on the branch at the
    base's version + 1, main untouched; a stale expected version is refused."""
    main = StateStore(app)
    main.put("customer", 7, {"tier": "gold"}, expected_version=0)
    with app.storage.transaction() as tx:
        tx.branch_create(BranchCreate("fork:by-hand", "main", app.hlc.tick(), "fork", 0.0))
    branch = StateStore(app, "fork:by-hand")
    assert branch.get("customer", 7).data == {"tier": "gold"}, "read through to main"
    written = branch.put("customer", 7, {"tier": "silver"}, expected_version=1)
    assert (written.version, written.data) == (2, {"tier": "silver"})
    assert branch.get("customer", 7).data == {"tier": "silver"}
    assert (main.get("customer", 7).version, main.get("customer", 7).data) == (1, {"tier": "gold"})
    with pytest.raises(replayq.ConcurrencyError, match="expected version 1, found 2"):
        branch.put("customer", 7, {"tier": "bronze"}, expected_version=1)
