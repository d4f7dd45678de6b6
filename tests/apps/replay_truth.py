"""Jobs for the "replay and diff tell the truth" tests (issue 10), on the real test service.

``quote`` loads an order, reads stock through ``ctx.call`` (HTTP 4xx →
``ValidationError``, 5xx → ``DependencyError``, as a real client maps them),
saves a quote and texts the customer (``ctx.effect("sms.send")``):

* ``v1`` (active): retries dependency failures, 5 attempts, base 1 s;
* ``v2``: retries only ``transient`` — a dependency failure is now final;
* ``v3``: turns a validation failure of the stock read into a dependency failure;
* ``v4``: also emails the customer, an effect no v1 recording has.

``fenced`` holds a lock around a write; the lock is broken while the step's
dependency call is in flight (``INTERLUDE``), so fencing rejects the write.

``reserve`` writes a quantity under a lock (no interlude): run twice, the second
holder's fencing token is newer than the first's.

``hold`` holds a lock (TTL 0.2 s) for as long as told (``contract lint``).

``text`` sends one SMS whose provider answers 503 (``DependencyError``) until it
does not: failed executions, then one that succeeded.

``hold_stock`` places a hold under a per-attempt key, then fails once to confirm:
two attempts, each with its own hold; ``stock.hold`` has a compensator.

``price_write`` caches a product's price under a versioned key;
``price_read`` reads the latest cached price (stale once the product moved on).
"""

from __future__ import annotations

import os
import time
import urllib.error
from collections.abc import Callable
from typing import Any

import replayq
from tests.services import SERVICE_ENV, request

ORDER = {"sku": "sku-1", "qty": 3, "phone": "+100"}
V1_RETRY = replayq.Retry(max_attempts=5, base="1s", cap="1m")
V2_RETRY = replayq.Retry(max_attempts=3, base="1s", cap="1m", on=("transient",))
QUICK_RETRY = replayq.Retry(max_attempts=5, base="1s", cap="1s")

# What happens while ``fenced`` waits on its dependency (a test sets it; a replay never runs it).
INTERLUDE: list[Callable[[], Any]] = []


def service_url() -> str:
    return os.environ[SERVICE_ENV]


def get_stock(sku: str) -> Any:
    """The stock read, with HTTP errors classified as a real client would."""
    try:
        return request("GET", f"{service_url()}/inventory/{sku}")
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            raise replayq.ValidationError(f"inventory refused {sku}: HTTP {exc.code}") from exc
        raise replayq.DependencyError(f"inventory unavailable: HTTP {exc.code}") from exc


def send_text(phone: str, body: str) -> Any:
    return request("POST", f"{service_url()}/email", {"to": phone, "subject": body})


def quote(ctx: replayq.Context, order_id: int, *, wrap: bool, email: bool) -> dict[str, Any]:
    with ctx.step("load"):
        order = ctx.state.get("order", order_id)
    with ctx.step("price"):
        try:
            stock = ctx.call("inventory.get", get_stock, order.data["sku"])
        except replayq.ValidationError as exc:
            if not wrap:
                raise
            raise replayq.DependencyError(f"treated as an outage: {exc}") from exc
    with ctx.step("save"):
        saved = {"available": stock["available"], "qty": order.data["qty"]}
        ctx.state.put("quote", order_id, saved)
    with ctx.step("notify"):
        ctx.effect(
            "sms.send", lambda: send_text(order.data["phone"], "quoted"), key=f"sms:{order_id}"
        )
        if email:
            ctx.effect(
                "email.send", lambda: send_text("ann@example.com", "quoted"), key=f"mail:{order_id}"
            )
    return {"available": stock["available"]}


def send_text_classified(phone: str, body: str) -> Any:
    try:
        return send_text(phone, body)
    except urllib.error.HTTPError as exc:
        raise replayq.DependencyError(f"sms provider unavailable: HTTP {exc.code}") from exc


def place_hold(sku: str) -> Any:
    return request("POST", f"{service_url()}/warehouse/shipments", {"order_id": sku})


def release_hold(shipment_id: str) -> Any:
    return request("POST", f"{service_url()}/warehouse/cancellations", {"shipment_id": shipment_id})


def interlude() -> Any:
    for hook in INTERLUDE:
        hook()
    return {"ok": True}


def declare(app: replayq.App) -> replayq.App:
    options: dict[str, Any] = {"idempotency": "quote:{order_id}", "ordering": "order:{order_id}"}

    @app.job("quote", version="v1", retry=V1_RETRY, **options)
    def quote_v1(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return quote(ctx, order_id, wrap=False, email=False)

    @app.job("quote", version="v2", candidate=True, retry=V2_RETRY, **options)
    def quote_v2(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return quote(ctx, order_id, wrap=False, email=False)

    @app.job("quote", version="v3", candidate=True, retry=V1_RETRY, **options)
    def quote_v3(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return quote(ctx, order_id, wrap=True, email=False)

    @app.job("quote", version="v4", candidate=True, retry=V1_RETRY, **options)
    def quote_v4(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return quote(ctx, order_id, wrap=False, email=True)

    @app.job("fenced", retry=replayq.Retry(max_attempts=1))
    def fenced(ctx: replayq.Context, sku: str) -> None:
        with ctx.lock(f"stock:{sku}", ttl="30s"), ctx.step("reserve"):
            ctx.state.put("stock", sku, {"reserved": 1})
            ctx.call("warehouse.slow", interlude)

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, sku: str, qty: int) -> None:
        with ctx.lock(f"stock:{sku}", ttl="30s"), ctx.step("reserve"):
            ctx.state.put("stock", sku, {"reserved": qty})

    @app.job("hold", lease="30s", retry=replayq.Retry(max_attempts=1))
    def hold(ctx: replayq.Context, sku: str, seconds: float) -> None:
        with ctx.lock(f"shelf:{sku}", ttl=0.2), ctx.step("hold"):
            time.sleep(seconds)

    @app.job("text", idempotency="text:{order_id}", retry=QUICK_RETRY)
    def text(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("send"):
            ctx.effect(
                "sms.send", lambda: send_text_classified("+100", "hi"), key=f"sms:{order_id}"
            )

    @app.job("hold_stock", idempotency="hold:{sku}", retry=QUICK_RETRY)
    def hold_stock(ctx: replayq.Context, sku: str) -> None:
        with ctx.step("hold"):
            ctx.effect("stock.hold", lambda: place_hold(sku), key=f"hold:{sku}:{ctx.attempt}")
        with ctx.step("confirm"):
            if ctx.attempt == 1:
                raise replayq.TransientError("the confirmation timed out")

    @app.compensator("stock.hold")
    def undo_hold(key: str, result: Any) -> None:
        release_hold(result["shipment_id"])

    @app.job("price_write")
    def price_write(ctx: replayq.Context, sku: str) -> None:
        with ctx.step("load"):
            product = ctx.state.get("product", sku)
        with ctx.step("cache"):
            ctx.cache.set("price", sku, product.data, version=product.version, source="product")

    @app.job("price_read")
    def price_read(ctx: replayq.Context, sku: str) -> None:
        with ctx.step("read"):
            ctx.cache.get("price", sku, source="product")

    return app


def seed_order(app: replayq.App, order_id: int) -> None:
    app.state.put("order", order_id, dict(ORDER), expected_version=0)


app = declare(replayq.App())
