"""Rollback of internal state (as new versions, history kept); compensation of external effects."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from replayq.replay.rollback import RollbackRefusedError, compensate, rollback
from replayq.testing import run_inline
from tests.apps import replay_shop
from tests.context_support import named
from tests.replay_support import APP_SPEC, cli, cli_ok, idempotency_status, record
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_simulated_rollback_lists_what_would_change_and_writes_nothing(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    shipped = app.state.get("order", 1)
    history = app.state.history("order", 1)
    events = app.trace(job.id)

    plan = rollback(app, job.id, simulate=True)
    shown = cli_ok(app.url, "rollback", str(job.id), "--simulate").stdout

    assert plan.simulated and not plan.applied
    [change] = plan.changes
    assert (change.resource, change.current_version, change.restore_version) == ("order:1", 2, 1)
    assert change.current_data == shipped.data
    assert change.restored_data == replay_shop.ORDER
    assert change.later_writers == []
    assert shown.startswith("would restore order:1: v2 ")
    assert f"-> v1 {dict(sorted(replay_shop.ORDER.items()))!r}" in shown
    assert app.state.history("order", 1) == history
    assert app.trace(job.id) == events


def test_rollback_restores_prior_versions_as_new_versions(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    plan = rollback(app, job.id)

    assert plan.applied
    history = app.state.history("order", 1)
    assert [v.version for v in history] == [1, 2, 3], "history is kept"
    assert history[1].data["status"] == "shipped"
    assert history[2].data == history[0].data == replay_shop.ORDER
    assert app.state.get("order", 1).version == 3
    [event] = named(app, job.id, "state.rolled_back")
    assert event.resource == "order:1"
    assert event.resource_version == 3
    assert event.data["restored_from_version"] == 1
    assert event.data["replaced_version"] == 2
    assert service.counts() == before, "a rollback does not touch the real world"


def test_rollback_refuses_when_a_later_job_wrote_the_entity_and_force_restores(
    app: replayq.App, service: Service
) -> None:
    first = record(app)
    later = run_inline(app, "ship_order", {"order_id": 1, "shipping": "express"})
    assert app.state.get("order", 1).version == 3
    history = app.state.history("order", 1)

    with pytest.raises(RollbackRefusedError) as refused:
        rollback(app, first.id)
    through_cli = cli(app.url, "rollback", str(first.id))

    assert f"job {later.id} wrote order:1 after job {first.id}" in str(refused.value)
    assert through_cli.returncode == 2
    assert f"job {later.id} wrote order:1" in through_cli.stderr
    assert app.state.history("order", 1) == history, "a refused rollback writes nothing"
    [change] = rollback(app, first.id, simulate=True).changes
    assert change.later_writers == [later.id]

    cli_ok(app.url, "rollback", str(first.id), "--force")

    head = app.state.get("order", 1)
    assert head.version == 4
    assert head.data == replay_shop.ORDER
    [event] = named(app, first.id, "state.rolled_back")
    assert event.data["forced_over"] == [later.id]


def test_rollback_compensate_runs_the_compensator_and_marks_the_effect(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    shown = cli_ok(app.url, "rollback", str(job.id), "--compensate", "--app", APP_SPEC).stdout

    assert "compensated effect ship:1" in shown
    assert service.counts()["/warehouse/cancellations"] == 1
    assert service.counts()["/warehouse/shipments"] == before["/warehouse/shipments"]
    assert idempotency_status(app, "ship:1") == "compensated"
    assert idempotency_status(app, "email:1:shipped") == "succeeded", "no compensator for email"
    [event] = named(app, job.id, "effect.compensated")
    assert event.status == "compensated"
    assert event.data == {"kind": "warehouse.ship", "key": "ship:1", "attempt": 1}
    assert app.state.get("order", 1).data == replay_shop.ORDER
    assert compensate(app, job.id) == [], "a compensated effect is not compensated twice"
    assert service.counts()["/warehouse/cancellations"] == 1
