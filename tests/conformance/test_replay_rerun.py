"""Guarded real re-execution: only allowed effect kinds reach the real service, once per key,
at a limited rate, and never without being asked twice."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest

import replayq
from replayq.model import JobState
from replayq.replay.rerun import rerun
from tests.apps import replay_shop
from tests.replay_support import (
    APP_SPEC,
    cli,
    cli_ok,
    derived_events,
    idempotency_status,
    lineage_of_job,
    record,
    record_dead,
)
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_rerun_runs_only_the_allowed_effect_kind_for_real(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email")
    job = record_dead(app)
    before = service.counts()
    assert idempotency_status(app, "email:1:shipped") == "failed"

    report = rerun(app, job.id, allow_effects=["email.send"])

    after = service.counts()
    assert report.outcome.status == "succeeded", report.outcome
    assert after["/email"] == before["/email"] + 1, "the allowed kind ran for real"
    assert after["/warehouse/shipments"] == before["/warehouse/shipments"], "not allowed"
    assert after["/inventory/sku-1"] == before["/inventory/sku-1"] + 1, "reads are real in a rerun"
    assert report.substituted == ["warehouse.ship"]
    assert report.refused == []
    assert service.mail()[-1] == {"to": "ann@example.com", "subject": "order 1 shipped"}
    events = derived_events(app, report.trace_id)
    [substituted] = [e for e in events if e.name == "effect.replayed"]
    assert substituted.data["kind"] == "warehouse.ship"
    assert substituted.data["result"]["shipment_id"] == "shp-1", "the recorded result"
    [sent] = [e for e in events if e.name == "effect.succeeded"]
    assert sent.data["kind"] == "email.send" and sent.side_effect
    assert idempotency_status(app, "email:1:shipped") == "succeeded"
    assert app.get_job(job.id).state == JobState.DEAD, "a rerun never changes the original job"


def test_rerun_does_not_repeat_an_effect_whose_key_already_succeeded(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    report = rerun(app, job.id, allow_effects=["warehouse.ship", "email.send"])

    after = service.counts()
    assert report.outcome.status == "succeeded"
    assert report.outcome.result == job.result, "the stored results"
    assert after["/warehouse/shipments"] == before["/warehouse/shipments"]
    assert after["/email"] == before["/email"]
    deduplicated = [
        e for e in derived_events(app, report.trace_id) if e.name == "effect.deduplicated"
    ]
    assert {e.data["key"] for e in deduplicated} == {"ship:1", "email:1:shipped"}
    assert {e.data["first_job"] for e in deduplicated} == {job.id}


def test_rerun_refuses_a_kind_that_is_not_allowed_and_has_no_recorded_result(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email")
    job = record_dead(app)
    before = service.counts()

    report = rerun(app, job.id, allow_effects=["warehouse.ship"])

    after = service.counts()
    assert report.outcome.status == "failed"
    assert report.outcome.error_class == "unknown", "a class, as the worker classes failures"
    assert report.outcome.error is not None
    assert report.outcome.error.startswith("EffectRefusedError: ")
    assert "'email.send'" in report.outcome.error
    assert report.refused == ["email.send"]
    assert after["/email"] == before["/email"]
    assert after["/warehouse/shipments"] == before["/warehouse/shipments"], "key succeeded"
    [refused] = [e for e in derived_events(app, report.trace_id) if e.name == "effect.refused"]
    assert refused.data["kind"] == "email.send"
    assert idempotency_status(app, "email:1:shipped") == "failed", "nothing was claimed"


def test_bulk_rerun_through_the_cli_holds_the_rate_limit(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email", times=3)
    jobs = [record_dead(app, order_id) for order_id in (1, 2, 3)]
    before = service.counts()

    shown = cli_ok(
        app.url,
        "rerun",
        "--type",
        "ship_order",
        "--state",
        "dead",
        "--allow-effects",
        "email.send",
        "--rate",
        "5/s",
        "--yes",
        "--app",
        APP_SPEC,
        "--json",
    ).stdout

    reports = json.loads(shown)
    assert sorted(r["job_id"] for r in reports) == sorted(j.id for j in jobs)
    assert all(r["outcome"]["status"] == "succeeded" for r in reports)
    assert service.counts()["/email"] == before["/email"] + 3
    assert service.counts()["/warehouse/shipments"] == before["/warehouse/shipments"]
    starts = sorted(row["created_at"] for job in jobs for row in lineage_of_job(app, job))
    assert len(starts) == 3
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # 5/s: the limiter spaces the reruns' starts 0.2 s apart on the monotonic clock, each
    # start taken once its recording is read, just before its lineage row's created_at, so
    # a slow first read (the first rerun also loads the replay modules) cannot shrink a gap.
    # The slack is for the scheduler between the two clock reads. Unlimited, three reruns of
    # this job start well under 0.15 s apart.
    assert all(gap >= 0.15 for gap in gaps), gaps
    assert starts[-1] - starts[0] >= 0.35, gaps


def test_rerun_is_refused_without_allow_effects_or_confirmation(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    no_kinds = cli(app.url, "rerun", str(job.id), "--app", APP_SPEC, "--yes")
    no_yes = cli(app.url, "rerun", str(job.id), "--app", APP_SPEC, "--allow-effects", "email.send")

    assert no_kinds.returncode == 2
    assert "--allow-effects" in no_kinds.stderr
    assert no_yes.returncode == 2
    assert "--yes" in no_yes.stderr
    with pytest.raises(replayq.ConfigurationError, match="--allow-effects"):
        rerun(app, job.id, allow_effects=[])
    assert service.counts() == before
    assert lineage_of_job(app, job) == [], "no rerun was started"
