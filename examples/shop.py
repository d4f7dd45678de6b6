"""The README's tour: a shop that ships paid orders (run from this folder; see README.md)."""

import replayq

app = replayq.App()  # the database: --db, else $REPLAYQ_DB, else sqlite:///replayq.db


class Warehouse:
    """Stands in for the warehouse's HTTP API: one shipment per call."""

    def create(self, order_id: int, *, carrier: str = "standard") -> dict:
        return {"id": f"shp-{order_id}-{carrier}", "carrier": carrier}


warehouse = Warehouse()
CONTRACT = dict(
    lease="30s",
    heartbeat="10s",
    retry=replayq.Retry(
        max_attempts=5, base="1s", cap="5m", jitter="full", on=("transient", "dependency")
    ),
    idempotency="ship_order:{order_id}",
    ordering="order:{order_id}",
    lock="order:{order_id}",
    lock_ttl="60s",
    effects=["warehouse.create_shipment"],
)


def ship(ctx: replayq.Context, order_id: int, version: str) -> dict:
    with ctx.step("load_order"):
        order = ctx.state.get("order", order_id)  # Entity(version, data)
    if ctx.decide("ship", order.data["status"] == "paid", status=order.data["status"]) is False:
        raise replayq.ValidationError("order is not paid")  # never retried: straight to dead
    with ctx.step("create_shipment"):
        carrier = "standard"
        if version == "v3":  # v3 sends orders of several items express
            carrier = ctx.decide("carrier", "express" if order.data["items"] > 1 else "standard")
        shipment = ctx.effect(
            "warehouse.create_shipment",  # once per business key
            lambda: warehouse.create(order_id, carrier=carrier),
        )
    with ctx.step("mark_shipped"):
        ctx.state.put(
            "order", order_id, {**order.data, "status": "shipped"}, expected_version=order.version
        )  # versioned, fenced by the lock
        ctx.outbox.publish("order.shipped", {"order_id": order_id})
    return {"shipment_id": shipment["id"]}


@app.job("ship_order", version="v2", **CONTRACT)
def ship_order(ctx: replayq.Context, order_id: int) -> dict:
    return ship(ctx, order_id, "v2")


@app.job("ship_order", version="v3", candidate=True, **CONTRACT)  # declared, not yet live
def ship_order_v3(ctx: replayq.Context, order_id: int) -> dict:
    return ship(ctx, order_id, "v3")
