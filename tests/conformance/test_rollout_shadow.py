"""Shadow and dual-run on every backend: the candidate runs sealed on the authoritative run's
answers, so at 100 % it makes zero real effects, dual-run makes exactly one real effect per
key, and every comparison is stored for ``rollout status``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import replayq
from tests.apps import rollout_app
from tests.services import SERVICE_ENV, Service, request

AppFactory = Callable[..., replayq.App]
SHIPMENTS = "/warehouse/shipments"


def ship_app(app_factory: AppFactory) -> replayq.App:
    app = app_factory()

    def body(ctx: replayq.Context, order: int) -> Any:
        base = os.environ[SERVICE_ENV]
        with ctx.step("ship"):
            return ctx.effect(
                "shipment",
                lambda: request("POST", f"{base}{SHIPMENTS}", {"order": order}),
                key=f"ship:{order}",
            )

    @app.job("ship", version="v1", effects=["shipment"])
    def ship_v1(ctx: replayq.Context, order: int) -> Any:
        return body(ctx, order)

    @app.job("ship", version="v2", effects=["shipment"], candidate=True)
    def ship_v2(ctx: replayq.Context, order: int) -> Any:
        return body(ctx, order)

    return app


def test_shadow_at_100_percent_makes_zero_real_effects(
    app_factory: AppFactory, service: Service
) -> None:
    app = ship_app(app_factory)
    rollout = app.rollout("ship")
    rollout.shadow("v2", fraction="100%", reason="shadow everything")
    app.enqueue_many([replayq.EnqueueRequest("ship", {"order": n}) for n in range(20)])

    replayq.Worker(app, burst=True, routing_refresh=0).run()

    assert service.counts().get(SHIPMENTS) == 20, "only v1's effects are real"
    shadows = rollout.comparisons("shadow")
    assert len(shadows) == 20
    assert all(row["classes"] == [] for row in shadows)
    assert rollout.comparison_summary() == {
        "shadow": {"compared": 20, "differing": 0, "classes": {}}
    }
    assert {job.handler_version for job in app.list_jobs(job_type="ship")} == {"v1"}


def test_a_shadow_that_bypasses_ctx_reaches_nothing_and_is_reported(
    app_factory: AppFactory, service: Service
) -> None:
    app = rollout_app.declare(app_factory())
    app.rollout("price").shadow("v2-leaky", fraction="100%")
    app.enqueue_many([replayq.EnqueueRequest("price", {"sku": "s", "qty": n}) for n in range(6)])

    replayq.Worker(app, burst=True, routing_refresh=0).run()

    assert service.counts() == {"/inventory/s": 6}, "the shadow made a request"
    shadows = app.rollout("price").comparisons("shadow")
    assert len(shadows) == 6
    assert all("unrecorded_io" in row["classes"] for row in shadows)


def test_dual_run_makes_exactly_one_real_effect_per_key(
    app_factory: AppFactory, service: Service
) -> None:
    app = ship_app(app_factory)
    app.rollout("ship").dual_run("v2", reason="compare every job")
    app.enqueue_many([replayq.EnqueueRequest("ship", {"order": n}) for n in range(15)])

    replayq.Worker(app, burst=True, concurrency=3, routing_refresh=0).run()

    assert service.counts().get(SHIPMENTS) == 15
    effects = app.effects(kind="shipment", limit=100)
    assert sorted(e.key for e in effects) == sorted(f"ship:{n}" for n in range(15))
    assert all(e.status == "succeeded" for e in effects)
    runs = app.rollout("ship").comparisons("dual-run")
    assert sorted(row["job_id"] for row in runs) == sorted(
        job.id for job in app.list_jobs(job_type="ship")
    )
    assert all(row["classes"] == [] for row in runs)
