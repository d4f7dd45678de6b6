"""A shop for the dashboard's browser tests: a dead v1 job that v2 would have shipped.

``ship_order`` v1 (active) compares the order's status with ``"PAID"`` (the bug:
statuses are lower case), decides not to ship and raises a validation error, so
the job dies on its first attempt. v2 (candidate) compares correctly, creates a
shipment through ``ctx.effect`` and marks the order shipped. Forking the dead job
from step ``decide`` onto v2 flips the decision, writes ``status: shipped`` and
intends one shipment: the diff the dashboard must show.
"""

from __future__ import annotations

from typing import Any

import replayq

ONE_ATTEMPT = replayq.Retry(max_attempts=1)


def ship(ctx: replayq.Context, order_id: int, note: str, paid_status: str) -> dict[str, Any]:
    with ctx.step("load_order"):
        order = ctx.state.get("order", order_id)
    with ctx.step("check_stock"):
        stock = ctx.call("inventory.get", lambda: {"available": 5})
    with ctx.step("decide"):
        ship_now = ctx.decide(
            "ship",
            order.data["status"] == paid_status and stock["available"] > 0,
            status=order.data["status"],
        )
        if not ship_now:
            raise replayq.ValidationError(f"order {order_id} is not paid ({note})")
    with ctx.step("ship"):
        # A fork does not run effects: past the fork point one answers None (intended only).
        shipment = ctx.effect(
            "warehouse.create_shipment", lambda: {"id": f"S-{order_id}"}, key=f"ship:{order_id}"
        )
        shipment_id = (shipment or {}).get("id")
        ctx.state.put(
            "order",
            order_id,
            {**order.data, "status": "shipped", "shipment": shipment_id},
            expected_version=order.version,
        )
    return {"shipment": shipment_id}


def declare(app: replayq.App) -> replayq.App:
    options: dict[str, Any] = {
        "lock": "order:{order_id}",
        "lock_ttl": "30s",
        "retry": ONE_ATTEMPT,
        "effects": ["warehouse.create_shipment"],
    }

    @app.job("ship_order", version="v1", **options)
    def ship_v1(ctx: replayq.Context, order_id: int, note: str = "") -> dict[str, Any]:
        return ship(ctx, order_id, note, "PAID")

    @app.job("ship_order", version="v2", candidate=True, **options)
    def ship_v2(ctx: replayq.Context, order_id: int, note: str = "") -> dict[str, Any]:
        return ship(ctx, order_id, note, "paid")

    return app


app = declare(replayq.App())
