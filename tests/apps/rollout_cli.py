"""``price`` as docs/rollout.md declares it, v1 live and v2 a candidate, for the
``replayq rollout`` commands run as written. v2 caches a new value shape under v1's key
(``cache_shape`` in a verification) with the same steps."""

from __future__ import annotations

import replayq

RETRY = replayq.Retry(on=("transient",))


def declare(app: replayq.App) -> replayq.App:
    def body(ctx: replayq.Context, sku: str, qty: int, nested: bool) -> dict[str, object]:
        with ctx.step("quote"):
            unit = ctx.call("catalog.unit_price", lambda: 100 + len(sku))
        with ctx.step("cache"):
            amount = unit * qty
            value: dict[str, object] = {"amount": {"cents": amount} if nested else amount}
            ctx.cache.set("price", sku, value)
        return value

    @app.job("price", version="v1", retry=RETRY)
    def price_v1(ctx: replayq.Context, sku: str, qty: int) -> dict[str, object]:
        return body(ctx, sku, qty, nested=False)

    @app.job("price", version="v2", retry=RETRY, candidate=True)
    def price_v2(ctx: replayq.Context, sku: str, qty: int) -> dict[str, object]:
        return body(ctx, sku, qty, nested=True)

    return app


app = declare(replayq.App())
