"""A job that reserves stock under a lock on the warehouse, for the lock-release tests.

``reserve`` takes ``warehouse:1`` inside its step, reads the stock, writes the stock and
the order ``order:N`` (an entity the lock is not named after), lets go of the lock and
goes on with the rest of the step (its writes still pending) until another holder has
the lock or ``hold`` seconds pass: the window in which a lock released at once let
another worker read the stock the first was about to change.
"""

from __future__ import annotations

import time

import replayq
from replayq.storage.protocol import lock_get

WAREHOUSE = "warehouse:1"


def _until_taken(ctx: replayq.Context, ours: str, hold: float) -> None:
    """Wait until another owner holds the warehouse's lock, or ``hold`` seconds."""
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        with ctx.runtime.storage.transaction(readonly=True) as tx:
            row = lock_get(tx, WAREHOUSE)
        if row is not None and row.owner_token not in (None, ours):
            return
        time.sleep(0.02)


def reserve(ctx: replayq.Context, order: int, hold: float) -> int:
    with ctx.step("reserve"):
        with ctx.lock(WAREHOUSE, ttl="30s", wait="60s") as lock:
            units = ctx.state.get("stock", 1).data["units"]
            ctx.state.put("stock", 1, {"units": units - 1})
            ctx.state.put("order", order, {"stock_before": units, "by": ctx.worker_id})
        _until_taken(ctx, lock.owner_token, hold)
    return int(units)


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("reserve", lease="10s", retry=replayq.Retry(max_attempts=1))(reserve)
    return built


app = build()
