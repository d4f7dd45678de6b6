"""Jobs for the fencing and in-doubt acceptance tests: every write path, and one real effect.

``charge`` writes, in one step, a state version, a ``ctx.db_write`` row (table
``fenced_rows``, created by the test) and an outbox event, all naming the
worker; it sleeps ``step_seconds`` inside the step (writes pending, a window
to freeze the worker in), then makes one effect under a per-attempt key: a
``POST /warehouse/shipments`` to the counting test service. ``charge_once``
makes one effect under a business key and sleeps ``after_seconds`` *after*
the request, before the outcome is recorded (a window to kill the worker in:
the effect happened, the ledger does not know). The side file gets one JSON
line per real effect, with the worker id: the ground truth.
"""

from __future__ import annotations

import os
import time
from typing import Any

import replayq
from tests.apps.sleepy import record
from tests.services import SERVICE_ENV, request

RETRY = replayq.Retry(max_attempts=10, base="0.05s", cap="0.2s")


def _worker(ctx: replayq.Context) -> str:
    return ctx.worker_id


def charge(ctx: replayq.Context, n: int, sink: str, step_seconds: float = 0.0) -> dict[str, Any]:
    marker = "?" if ctx.runtime.storage.dialect == "sqlite" else "%s"
    worker = _worker(ctx)
    record(sink, "start", n, worker=worker, attempt=ctx.attempt)

    def insert(connection: Any) -> None:
        connection.execute(
            f"INSERT INTO fenced_rows (job_id, worker) VALUES ({marker}, {marker})",  # noqa: S608 - placeholder marker only
            (ctx.job_id, worker),
        )

    with ctx.step("write"):
        ctx.state.put("account", n, {"by": worker, "attempt": ctx.attempt})
        ctx.db_write(insert)
        ctx.outbox.publish("account.charged", {"n": n, "by": worker})
        time.sleep(step_seconds)

    def effect() -> Any:
        record(sink, "effect", n, worker=worker, attempt=ctx.attempt)
        return request("POST", f"{os.environ[SERVICE_ENV]}/warehouse/shipments", {"n": n})

    shipment = ctx.effect("warehouse.ship", effect, key=f"ship-{n}-attempt-{ctx.attempt}")
    return {"by": worker, "shipment": shipment["shipment_id"]}


def charge_once(ctx: replayq.Context, n: int, sink: str, after_seconds: float = 0.0) -> Any:
    worker = _worker(ctx)

    def effect() -> Any:
        answer = request("POST", f"{os.environ[SERVICE_ENV]}/warehouse/shipments", {"n": n})
        record(sink, "effect", n, worker=worker, attempt=ctx.attempt)
        if ctx.attempt == 1:  # the first attempt is held here until the test kills it
            time.sleep(after_seconds)  # the effect happened; its outcome is not recorded yet
        return answer

    return ctx.effect("warehouse.ship", effect, key=f"ship-{n}")


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("charge", lease="2s", heartbeat="0.5s", retry=RETRY)(charge)
    built.job("charge_once", lease="1s", heartbeat="0.3s", retry=RETRY)(charge_once)
    return built


app = build()
