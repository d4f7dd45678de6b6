"""Order jobs that use the recording context, for acceptance tests with real worker processes.

Handlers append JSON lines to the side file named in the payload (``log``):
``effect`` each time a real side effect happens, ``pause`` when they reach the
point where a test freezes or kills them, ``consumed`` when an outbox event
arrives. ``$SHOP_PAUSE_AT`` names that point; only a worker started with it
pauses there (it sleeps ``$SHOP_PAUSE_SECONDS``, or until the file
``<log>.go`` exists).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import replayq
from tests.apps.sleepy import SHORT_LEASE, record

QUICK_RETRY = replayq.Retry(max_attempts=5, base="0.05s", cap="0.2s")


def pause(ctx: replayq.Context, log: str, point: str, order_id: int) -> None:
    """Stop here if this worker was told to (``$SHOP_PAUSE_AT``) and this is attempt 1."""
    if os.environ.get("SHOP_PAUSE_AT") != point or ctx.attempt != 1:
        return
    record(log, "pause", order_id, point=point, worker=ctx.worker_id, attempt=ctx.attempt)
    seconds = float(os.environ.get("SHOP_PAUSE_SECONDS", "30"))
    go = Path(f"{log}.go")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not go.exists():
        time.sleep(0.02)


def create_shipment(log: str, order_id: int, worker_id: str) -> dict[str, Any]:
    """The real side effect: one ``effect`` line in the side file per shipment created."""
    record(log, "effect", order_id, worker=worker_id)
    return {"shipment": f"shp-{order_id}", "created_by": worker_id}


def ship_order(ctx: replayq.Context, log: str, order_id: int) -> dict[str, Any]:
    """Under the contract lock ``order:{order_id}``: create the shipment, then mark the order."""
    with ctx.step("create_shipment"):
        shipment = ctx.effect(
            "warehouse.create_shipment",
            lambda: create_shipment(log, order_id, ctx.worker_id),
            key=f"shipment:{order_id}",
        )
    with ctx.step("mark_shipped"):
        order = ctx.state.get("order", order_id)
        ctx.state.put(
            "order",
            order_id,
            {**(order.data or {}), "status": "shipped", "marked_by": ctx.worker_id},
            expected_version=order.version,
        )
        pause(ctx, log, "before_state_commit", order_id)
    return {"shipment": shipment["shipment"], "marked_by": ctx.worker_id}


def place_order(ctx: replayq.Context, log: str, order_id: int) -> dict[str, Any]:
    """Record the order and its outbox event in one step, then send the confirmation."""
    with ctx.step("load"):
        order = ctx.state.get("order", order_id)
    if not ctx.decide("already_placed", order.exists, version=order.version):
        with ctx.step("record_order"):
            ctx.state.put("order", order_id, {"status": "placed"}, expected_version=0)
            ctx.outbox.publish("order.placed", {"order_id": order_id, "log": log})
            pause(ctx, log, "before_step_commit", order_id)
    pause(ctx, log, "after_step_commit", order_id)
    with ctx.step("confirm"):
        ctx.effect(
            "email.send",
            lambda: record(log, "effect", order_id, worker=ctx.worker_id),
            key=f"confirm:{order_id}",
        )
    return {"order_id": order_id}


def on_order_placed(ctx: replayq.Context, event_id: str, payload: dict[str, Any]) -> None:
    """The outbox consumer: one ``consumed`` line per delivery."""
    record(payload["log"], "consumed", payload["order_id"], event_id=event_id)


def touch_order(ctx: replayq.Context, log: str, order_id: int, hold: float) -> dict[str, int]:
    """Under the contract lock: read the order, hold a while, write version + 1."""
    with ctx.step("touch"):
        order = ctx.state.get("order", order_id)
        time.sleep(hold)
        written = ctx.state.put(
            "order",
            order_id,
            {**(order.data or {}), "touches": (order.data or {}).get("touches", 0) + 1},
            expected_version=order.version,
        )
    record(log, "touched", order_id, worker=ctx.worker_id, read=order.version)
    return {"read": order.version, "wrote": written.version}


def hold_order(ctx: replayq.Context, log: str, order_id: int) -> dict[str, int]:
    """Take the contract lock, wait for the test (``pause``), then write the order."""
    with ctx.step("adjust"):
        order = ctx.state.get("order", order_id)
        pause(ctx, log, "holding_lock", order_id)
        written = ctx.state.put(
            "order",
            order_id,
            {"adjusted_by_attempt": ctx.attempt},
            expected_version=order.version,
        )
    return {"wrote": written.version}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    locked = {"lock": "order:{order_id}", "retry": QUICK_RETRY, **SHORT_LEASE}
    built.job("ship_order", **locked)(ship_order)
    built.job("touch_order", **locked)(touch_order)
    built.job("hold_order", **locked)(hold_order)
    built.job("place_order", retry=QUICK_RETRY, **SHORT_LEASE)(place_order)
    built.job("order.placed", retry=QUICK_RETRY, **SHORT_LEASE)(on_order_placed)
    return built


app = build()
