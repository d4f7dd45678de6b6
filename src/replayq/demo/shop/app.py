"""The shop on replayq: reserve stock, charge, ship, send the invoice.

Written the way a user writes a replayq application. Orders and stock live in
replayq's versioned state (``order:<id>``, ``stock:<sku>``); the status page
reads the ``order_status`` cache; shipping publishes ``order.shipped`` through
the outbox.

``ship_order`` is declared twice. **v1** reproduces the ShipOrder incident of
seed 003; each of its mistakes is marked ``MISTAKE``. **v2** is the fix,
declared ``candidate=True``: it can be replayed, forked and verified against
recorded jobs before any worker runs it. Setting ``SHOP_SHIP_ORDER_VERSION=v2``
in the workers' environment is the deploy: v2 becomes the version they run.

Configuration comes from the environment: the database from ``$REPLAYQ_DB``,
the services' base URLs from ``$SHOP_WAREHOUSE_URL``, ``$SHOP_PAYMENT_URL`` and
``$SHOP_EMAIL_URL``. Durations are the seed's scaled down (seconds → tenths).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import replayq
from replayq.demo.shop import clients

ORDER = "order"
STOCK = "stock"
STATUS_CACHE = "order_status"


# -- the producer side: what the storefront and the order service do ---------------------------


def place_order(
    app: replayq.App,
    order_id: int,
    *,
    sku: str = "sku-red-mug",
    qty: int = 1,
    amount_cents: int = 1299,
    email: str = "customer@example.com",
) -> int:
    """Record a new order (version 1) and enqueue its stock reservation; returns the job id."""
    app.state.put(
        ORDER,
        order_id,
        {
            "status": "placed",
            "sku": sku,
            "qty": qty,
            "amount_cents": amount_cents,
            "email": email,
            "shipments": [],
        },
        expected_version=0,
    )
    return app.enqueue(
        "reserve_stock",
        {"order_id": order_id, "sku": sku, "qty": qty},
        message_id=f"order-placed:{order_id}",
    )


def stock_up(app: replayq.App, sku: str, on_hand: int) -> None:
    """Create a stock entity (outside any job: the warehouse's nightly import)."""
    app.state.put(STOCK, sku, {"on_hand": on_hand, "reserved": 0}, expected_version=0)


def payload_hash_message_id(payload: dict[str, Any]) -> str:
    """MISTAKE (v1 era): dedup on a hash of the whole payload, ``sent_at`` included.

    A re-sent event carries a new ``sent_at``, so it hashes differently and is
    not deduplicated.
    """
    raw = json.dumps(payload, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def request_shipment(
    app: replayq.App, order_id: int, *, sent_at: float, event_id: str | None = None
) -> int:
    """The order service asks for a shipment; returns the job id (an existing one if deduplicated).

    With ``event_id`` (the fix) the message id is the upstream event's id, stable
    across re-sends; without it, the v1-era payload hash.
    """
    payload = {"order_id": order_id, "sent_at": sent_at}
    message_id = event_id or payload_hash_message_id(payload)
    return app.enqueue("ship_order", payload, message_id=message_id)


def cached_status(app: replayq.App, order_id: int) -> tuple[Any, int | None] | None:
    """What the status page shows: the newest ``order_status`` entry (value, version), if any."""
    entry = app.cache_backend.latest(f"{STATUS_CACHE}:{order_id}", app.clock.now())
    return None if entry is None else (entry.value, entry.version)


# -- the application ----------------------------------------------------------------------------

QUICK = replayq.Retry(max_attempts=5, base="0.1s", cap="2s", on=("transient", "dependency"))


def build(url: str | None = None, *, deployed: str | None = None) -> replayq.App:
    """The shop's App; ``deployed`` names the ship_order version workers run (default: $env)."""
    deployed = deployed or os.environ.get("SHOP_SHIP_ORDER_VERSION", "v1")
    if deployed not in ("v1", "v2"):
        raise replayq.ConfigurationError(f"SHOP_SHIP_ORDER_VERSION={deployed!r}: use v1 or v2")
    app = replayq.App(url)

    @app.job(
        "reserve_stock",
        version="v1",
        lease="2s",
        heartbeat="0.5s",
        retry=replayq.Retry(
            max_attempts=5, base="0.05s", cap="1s", on=("transient", "concurrency")
        ),
        idempotency="reserve_stock:{order_id}",
        ordering="order:{order_id}",
        lock="stock:{sku}",
        lock_ttl="4s",
    )
    def reserve_stock(ctx: replayq.Context, order_id: int, sku: str, qty: int) -> dict[str, Any]:
        with ctx.step("reserve"):
            order = ctx.state.get(ORDER, order_id)
            stock = ctx.state.get(STOCK, sku)
            if ctx.decide("already_reserved", order.data["status"] != "placed"):
                return {"reserved": False}
            available = stock.data["on_hand"] - stock.data["reserved"]
            if not ctx.decide("in_stock", available >= qty, available=available, qty=qty):
                raise replayq.ValidationError(f"{sku}: {available} available, {qty} wanted")
            ctx.state.put(
                STOCK,
                sku,
                {**stock.data, "reserved": stock.data["reserved"] + qty},
                expected_version=stock.version,
            )
            ctx.state.put(
                ORDER,
                order_id,
                {**order.data, "status": "reserved"},
                expected_version=order.version,
            )
            ctx.enqueue(
                "charge_payment",
                {"order_id": order_id, "amount_cents": order.data["amount_cents"]},
            )
        return {"reserved": True}

    @app.job(
        "charge_payment",
        version="v1",
        lease="2s",
        heartbeat="0.5s",
        retry=QUICK,
        idempotency="payment:{order_id}:capture",
        ordering="order:{order_id}",
        effects={"payment.capture": "park"},
    )
    def charge_payment(ctx: replayq.Context, order_id: int, amount_cents: int) -> dict[str, Any]:
        with ctx.step("load_order"):
            order = ctx.state.get(ORDER, order_id)
            if ctx.decide("already_paid", order.data["status"] == "paid"):
                return {"payment_id": order.data["payment_id"]}
        key = f"payment:{order_id}:capture"
        with ctx.step("capture"):
            charge = ctx.effect(
                "payment.capture",
                lambda: clients.capture_payment(order_id, amount_cents, key),
                key=key,
            )
        with ctx.step("mark_paid"):
            written = ctx.state.put(
                ORDER,
                order_id,
                {**order.data, "status": "paid", "payment_id": charge["id"]},
                expected_version=order.version,
            )
            ctx.cache.set(
                STATUS_CACHE, order_id, {"status": "paid"}, version=written.version, source=ORDER
            )
        return {"payment_id": charge["id"]}

    @app.job(
        "send_invoice_email",
        version="v1",
        lease="2s",
        heartbeat="0.5s",
        retry=QUICK,
        idempotency="invoice:{order_id}",
        effects={"email.send": "park"},
    )
    def send_invoice_email(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        with ctx.step("load_order"):
            order = ctx.state.get(ORDER, order_id)
        key = f"invoice:{order_id}:send_email"
        with ctx.step("send"):
            sent = ctx.effect(
                "email.send",
                lambda: clients.send_email(
                    order_id, order.data["email"], f"Invoice for order {order_id}", key
                ),
                key=key,
            )
        return {"email_id": sent["id"]}

    @app.job(
        "refresh_order_status",
        version="v1",
        lease="2s",
        heartbeat="0.5s",
        retry=QUICK,
        cache_namespace=STATUS_CACHE,
    )
    def refresh_order_status(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        """The status page's cache-aside read: the entry for the order's current version."""
        with ctx.step("read"):
            order = ctx.state.get(ORDER, order_id)
            cached = ctx.cache.get(STATUS_CACHE, order_id, version=order.version, source=ORDER)
            if not cached.hit:
                ctx.cache.set(
                    STATUS_CACHE,
                    order_id,
                    {"status": order.data["status"]},
                    version=order.version,
                    source=ORDER,
                )
        return {"status": order.data["status"], "version": order.version, "hit": cached.hit}

    # -- ship_order v1: the incident --------------------------------------------------------

    @app.job(
        "ship_order",
        version="v1",
        # MISTAKE: a fixed visibility timeout shorter than a slow warehouse call, never
        # extended (heartbeat=0): a slow run is re-delivered to another worker mid-flight.
        lease="0.5s",
        heartbeat=0,
        # MISTAKE: retries every error, unclassified ones ("unknown") included, up to 10 times.
        retry=replayq.Retry(
            max_attempts=10,
            base="0.05s",
            cap="0.5s",
            on=("transient", "dependency", "concurrency", "unknown"),
        ),
        # MISTAKE: declares a side effect but no business idempotency key.
        effects={"warehouse.create_shipment": "retry"},
        cache_namespace=STATUS_CACHE,
    )
    def ship_order_v1(ctx: replayq.Context, order_id: int, sent_at: float) -> dict[str, Any]:
        with ctx.step("load_order"):
            order = ctx.state.get(ORDER, order_id)
            ship = ctx.decide("ship", order.data["status"] == "paid", status=order.data["status"])
            if ship:
                # MISTAKE: the status cache is written before the work, with the version read
                # now, and nothing invalidates it after the commit below.
                ctx.cache.set(
                    STATUS_CACHE,
                    order_id,
                    {"status": "shipping"},
                    version=order.version,
                    source=ORDER,
                )
        if not ship:
            return {"skipped": order.data["status"]}
        # MISTAKE: the generic lock is per job type, not per order; its TTL is the lease
        # and it is never renewed, so it expires under a slow call.
        with ctx.step("create_shipment"), ctx.lock("ship_order", ttl="0.5s"):
            # MISTAKE: the effect key contains the attempt: every delivery ships again.
            key = f"ship_order:{order_id}:attempt-{ctx.attempt}"
            shipment = ctx.effect(
                "warehouse.create_shipment",
                lambda: clients.create_shipment(order_id, key),
                key=key,
            )
        with ctx.step("mark_shipped"):
            # MISTAKE: read-modify-write of whatever is there now: the last writer wins.
            current = ctx.state.get(ORDER, order_id)
            ctx.state.put(
                ORDER,
                order_id,
                {
                    **current.data,
                    "status": "shipped",
                    "shipment_id": shipment["id"],
                    "shipments": [*current.data.get("shipments", []), shipment["id"]],
                },
            )
            ctx.outbox.publish("order.shipped", {"order_id": order_id, "shipment": shipment["id"]})
            ctx.enqueue("send_invoice_email", {"order_id": order_id})
        return {"shipment_id": shipment["id"]}

    # -- ship_order v2: the fix -------------------------------------------------------------

    @app.job(
        "ship_order",
        version="v2",
        candidate=deployed != "v2",
        # The lease fits the observed p99 (~3s with a slow warehouse), and the heartbeat
        # extends it while the worker is alive; a dead worker's job is re-delivered in 4s.
        lease="4s",
        heartbeat="0.5s",
        # Only timeouts and dependency errors are retried, with backoff and full jitter.
        retry=replayq.Retry(
            max_attempts=5, base="0.2s", cap="5s", jitter="full", on=("transient", "dependency")
        ),
        # The business idempotency key: one shipment per order, whatever the deliveries.
        idempotency="ship_order:{order_id}",
        ordering="order:{order_id}",
        # A lock per order, renewed by the heartbeat, whose fencing token guards the writes.
        lock="order:{order_id}",
        lock_ttl="8s",
        effects={"warehouse.create_shipment": "park"},
        cache_namespace=STATUS_CACHE,
    )
    def ship_order_v2(ctx: replayq.Context, order_id: int, sent_at: float) -> dict[str, Any]:
        with ctx.step("load_order"):
            order = ctx.state.get(ORDER, order_id)
            status = order.data["status"] if order.exists else "missing"
            if ctx.decide("already_shipped", status == "shipped", status=status):
                return {"shipment_id": order.data["shipment_id"], "already_shipped": True}
        if status != "paid":
            raise replayq.ValidationError(f"order {order_id} is {status}, not paid")
        key = f"ship_order:{order_id}"
        with ctx.step("create_shipment"):
            shipment = ctx.effect(
                "warehouse.create_shipment",
                lambda: clients.create_shipment(order_id, key, timeout=10.0),
                key=key,
            )
        with ctx.step("mark_shipped"):
            written = ctx.state.put(
                ORDER,
                order_id,
                {
                    **order.data,
                    "status": "shipped",
                    "shipment_id": shipment["id"],
                    "shipments": [shipment["id"]],
                },
                expected_version=order.version,
            )
            ctx.outbox.publish("order.shipped", {"order_id": order_id, "shipment": shipment["id"]})
            ctx.enqueue("send_invoice_email", {"order_id": order_id})
            # Versioned key, written after the state it mirrors, in the same step.
            ctx.cache.set(
                STATUS_CACHE,
                order_id,
                {"status": "shipped"},
                version=written.version,
                source=ORDER,
            )
        return {"shipment_id": shipment["id"]}

    return app


app = build()
