"""Incidents become regression tests: an exported case replays inside a user's own pytest suite
(``replayq.testing``), and ``run_inline`` runs a job without a worker process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import replayq
from replayq.model import JobState
from replayq.replay.export import export_case
from replayq.testing import assert_replays, replay_case, run_inline
from tests.apps import replay_shop
from tests.replay_support import APP_SPEC, cli_ok, record
from tests.services import Service

AppFactory = Callable[..., replayq.App]
FLIPPED = r"at step 'decide', event #\d+: recorded decision \('ship', 'true'\), now decision"


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_exported_case_passes_on_the_original_handler_and_fails_on_a_changed_one(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    case = json.loads(json.dumps(export_case(app, job.id)))  # what a case file holds
    before = service.counts()

    report = assert_replays(case, app)
    with pytest.raises(AssertionError, match=FLIPPED):
        assert_replays(case, app, version="v2")
    new_call = replay_case(case, app, version="v3")

    assert not report.diverged
    assert report.outcome_now.result == job.result
    assert new_call.error is not None and "fraud.score" in new_call.error
    assert service.counts() == before, "replaying a case calls nothing"


def test_case_exported_by_the_cli_replays_in_a_database_of_its_own(
    app: replayq.App, service: Service, tmp_path: Path
) -> None:
    job = record(app)
    case_file = tmp_path / "case.json"
    case_file.write_text(cli_ok(app.url, "trace", "export", str(job.id), "--app", APP_SPEC).stdout)
    before = service.counts()
    # A user's test suite: the handlers, a database that has never seen the job.
    elsewhere = replay_shop.declare(replayq.App(f"sqlite:///{tmp_path / 'elsewhere.db'}"))
    try:
        assert not assert_replays(case_file, elsewhere).diverged
        with pytest.raises(AssertionError, match=FLIPPED):
            assert_replays(str(case_file), elsewhere, version="v2")
        assert elsewhere.list_jobs(origin=None) == [], "the case ran in a scratch database"
    finally:
        elsewhere.close()
    assert service.counts() == before


def test_run_inline_runs_a_job_to_success_in_process(app: replayq.App, service: Service) -> None:
    replay_shop.seed_order(app, 1)

    job = run_inline(app, "ship_order", {"order_id": 1})

    assert job.state == JobState.SUCCEEDED
    assert job.result == {"status": "shipped", "shipment_id": "shp-1"}
    assert app.state.get("order", 1).data["status"] == "shipped"
    assert service.counts() == {"/inventory/sku-1": 1, "/warehouse/shipments": 1, "/email": 1}
    [leased] = [e for e in app.trace(job.id) if e.name == "job.leased"]
    assert leased.worker_id == "inline"


def test_run_inline_runs_its_own_job_when_others_are_queued_ahead(
    app: replayq.App, service: Service
) -> None:
    replay_shop.seed_order(app, 1)
    ahead = app.enqueue("send_receipt", {"order_id": 1})

    job = run_inline(app, "ship_order", {"order_id": 1})

    assert job.state == JobState.SUCCEEDED, "the job run_inline enqueued was run"
    assert app.get_job(ahead).state == JobState.SUCCEEDED, "as a worker would, in queue order"
