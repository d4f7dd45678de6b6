"""A job type with a baseline and four candidates, for ``rollout verify`` and the gates.

``price`` reads a quote from the counting HTTP service through ``ctx.call``,
caches it under ``price:<sku>`` and refuses a negative quantity with a plain
``ValueError`` (class ``unknown``: the baseline does not retry it). Candidates:

* ``v2-same``   — the same behaviour, rewritten;
* ``v2-retry``  — retries every exception (``unknown`` in ``Retry.on``): seed 004's bug;
* ``v2-shape``  — caches ``{"amount": {"value", "currency"}}`` under the same key;
* ``v2-leaky``  — reads the quote with ``urllib`` directly, bypassing ``ctx``.
"""

from __future__ import annotations

import os
from typing import Any

import replayq
from tests.services import SERVICE_ENV, request

BASELINE = replayq.Retry(max_attempts=5, base="1s", cap="5s", on=("transient",))
RETRY_ALL = replayq.Retry(max_attempts=5, base="1s", cap="5s", on=("transient", "unknown"))


def _quote(sku: str) -> Any:
    return request("GET", f"{os.environ[SERVICE_ENV]}/inventory/{sku}")


def declare(app: replayq.App) -> replayq.App:
    def body(
        ctx: replayq.Context, sku: str, qty: int, shape: str = "flat", leaky: bool = False
    ) -> dict[str, Any]:
        with ctx.step("quote"):
            quote = _quote(sku) if leaky else ctx.call("inventory", _quote, sku)
        with ctx.step("check"):
            if qty < 0:
                raise ValueError(f"quantity {qty} is negative")
        with ctx.step("cache"):
            value: Any = {"amount": quote["available"] * qty}
            if shape == "nested":
                value = {"amount": {"value": quote["available"] * qty, "currency": "IDR"}}
            ctx.cache.set("price", sku, value)
        return value

    @app.job("price", version="v1", retry=BASELINE)
    def price_v1(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        return body(ctx, sku, qty)

    @app.job("price", version="v2-same", retry=BASELINE, candidate=True)
    def price_same(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        return body(ctx, sku, qty)

    @app.job("price", version="v2-retry", retry=RETRY_ALL, candidate=True)
    def price_retry(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        return body(ctx, sku, qty)

    @app.job("price", version="v2-shape", retry=BASELINE, candidate=True)
    def price_shape(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        return body(ctx, sku, qty, shape="nested")

    @app.job("price", version="v2-leaky", retry=BASELINE, candidate=True)
    def price_leaky(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        return body(ctx, sku, qty, leaky=True)

    return app


app = declare(replayq.App())
