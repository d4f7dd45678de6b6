"""``price`` v1 with its lease from ``$PRICE_LEASE`` (default 30 s): a test starts a worker
whose code changed the lease without declaring a new version."""

from __future__ import annotations

import os

import replayq


def price(ctx: replayq.Context, sku: str) -> dict[str, str]:
    return {"sku": sku}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("price", lease=os.environ.get("PRICE_LEASE", "30s"))(price)
    return built


app = build()
