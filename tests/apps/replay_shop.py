"""An order-shipping job in three versions that talks to the real test service (tests/services.py).

``ship_order`` loads the order, reads stock from the inventory service
(``ctx.call``), decides whether to ship, creates a shipment at the warehouse
(``ctx.effect``), writes the order, publishes an outbox event and a child job,
and emails the customer through the email sink (``ctx.effect``).

* ``v1`` ships when stock covers the quantity (the active version);
* ``v2`` (candidate) keeps a safety margin of 10 units: the same recording flips
  the ``ship`` decision in step ``decide``;
* ``v3`` (candidate) calls the fraud service first, a call no v1 recording has.

Handlers find the service at ``$REPLAYQ_TEST_SERVICE``. ``declare(app)`` puts the
job types on any ``App`` (the conformance tests use ``app_factory``); the module's
``app`` is for the CLI (``--app tests.apps.replay_shop:app``, ``--db`` sets its URL).
"""

from __future__ import annotations

import os
from typing import Any

import replayq
from tests.services import SERVICE_ENV, request

ONE_ATTEMPT = replayq.Retry(max_attempts=1)
ORDER = {"sku": "sku-1", "qty": 3, "email": "ann@example.com", "status": "paid"}


def service_url() -> str:
    return os.environ[SERVICE_ENV]


def get_stock(sku: str) -> Any:
    return request("GET", f"{service_url()}/inventory/{sku}")


def fraud_score(order_id: int) -> Any:
    return request("GET", f"{service_url()}/fraud/{order_id}")


def create_shipment(order_id: int) -> Any:
    return request("POST", f"{service_url()}/warehouse/shipments", {"order_id": order_id})


def cancel_shipment(shipment_id: str) -> Any:
    return request("POST", f"{service_url()}/warehouse/cancellations", {"shipment_id": shipment_id})


def send_email(to: str, subject: str) -> Any:
    return request("POST", f"{service_url()}/email", {"to": to, "subject": subject})


def ship(
    ctx: replayq.Context, order_id: int, shipping: str, *, margin: int, fraud_check: bool
) -> dict[str, Any]:
    with ctx.step("load_order"):
        order = ctx.state.get("order", order_id)
    if fraud_check:
        with ctx.step("fraud_check"):
            ctx.call("fraud.score", fraud_score, order_id)
    with ctx.step("check_stock"):
        stock = ctx.call("inventory.get", get_stock, order.data["sku"])
    with ctx.step("decide"):
        ship_now = ctx.decide(
            "ship",
            stock["available"] >= order.data["qty"] + margin,
            available=stock["available"],
            qty=order.data["qty"],
            margin=margin,
        )
    with ctx.step("apply"):
        shipment_id = None
        if ship_now:
            shipment = ctx.effect(
                "warehouse.ship", lambda: create_shipment(order_id), key=f"ship:{order_id}"
            )
            shipment_id = shipment["shipment_id"]
        status = "shipped" if ship_now else "backordered"
        ctx.state.put(
            "order",
            order_id,
            {**order.data, "status": status, "shipment_id": shipment_id, "shipping": shipping},
        )
        ctx.outbox.publish("order.updated", {"order_id": order_id, "status": status})
        ctx.enqueue("send_receipt", {"order_id": order_id})
    with ctx.step("notify"):
        ctx.effect(
            "email.send",
            lambda: send_email(order.data["email"], f"order {order_id} {status}"),
            key=f"email:{order_id}:{status}",
        )
    return {"status": status, "shipment_id": shipment_id}


def declare(app: replayq.App) -> replayq.App:
    """Declare ``ship_order`` v1 (active), v2 and v3 (candidates), ``send_receipt``, and the
    warehouse compensator on ``app``."""
    options: dict[str, Any] = {
        "lock": "order:{order_id}",
        "lock_ttl": "60s",
        "retry": ONE_ATTEMPT,
    }

    @app.job("ship_order", version="v1", **options)
    def ship_v1(ctx: replayq.Context, order_id: int, shipping: str = "standard") -> dict[str, Any]:
        return ship(ctx, order_id, shipping, margin=0, fraud_check=False)

    @app.job("ship_order", version="v2", candidate=True, **options)
    def ship_v2(ctx: replayq.Context, order_id: int, shipping: str = "standard") -> dict[str, Any]:
        return ship(ctx, order_id, shipping, margin=10, fraud_check=False)

    @app.job("ship_order", version="v3", candidate=True, **options)
    def ship_v3(ctx: replayq.Context, order_id: int, shipping: str = "standard") -> dict[str, Any]:
        return ship(ctx, order_id, shipping, margin=0, fraud_check=True)

    @app.job("send_receipt")
    def send_receipt(ctx: replayq.Context, order_id: int) -> None:
        return None

    @app.compensator("warehouse.ship")
    def cancel(key: str, result: Any) -> None:
        cancel_shipment(result["shipment_id"])

    return app


def seed_order(app: replayq.App, order_id: int, **fields: Any) -> None:
    """Create ``order:<order_id>`` (version 1) on the production branch."""
    app.state.put("order", order_id, {**ORDER, **fields}, expected_version=0)


app = declare(replayq.App())
