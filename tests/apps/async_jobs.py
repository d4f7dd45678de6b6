"""``async def`` handlers: one that awaits a sleep, one that awaits ``ctx.call`` and
``ctx.effect`` against the real HTTP test service (tests/services.py) with an asyncio
client (``asyncio.open_connection``: no thread, the request is awaited on the loop).

``nap`` appends a JSON line per start and end to its side file (``log``), with the
event loop and thread it ran on. ``peek`` also reads the service directly, bypassing
``ctx``, for the seal. ``build(url)`` makes the app for tests; the module's
``app`` is for the CLI (``--app tests.apps.async_jobs:app``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.parse
from functools import partial
from typing import Any

import replayq
from tests.apps.sleepy import record
from tests.services import SERVICE_ENV


async def http(method: str, url: str, body: Any = None) -> Any:
    """One HTTP/1.1 request over an asyncio stream; the JSON reply (``RuntimeError`` >= 400)."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    data = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    await writer.wait_closed()
    status_line, _, rest = raw.partition(b"\r\n")
    status = int(status_line.split()[1])
    reply = rest.partition(b"\r\n\r\n")[2]
    if status >= 400:
        raise replayq.TransientError(f"{method} {parts.path}: HTTP {status}")
    return json.loads(reply) if reply else None


async def nap(ctx: replayq.Context, log: str, n: int, seconds: float) -> dict[str, int]:
    where = {"loop": id(asyncio.get_running_loop()), "thread": threading.get_ident()}
    record(log, "start", n, **where)
    await asyncio.sleep(seconds)
    record(log, "end", n, **where)
    return {"n": n}


async def notify(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
    base = os.environ[SERVICE_ENV]
    with ctx.step("read"):
        stock = await ctx.call("inventory.get", http, "GET", f"{base}/inventory/sku-1")
    with ctx.step("email"):
        # A coroutine function (here a partial of one): awaited inside the effect's record.
        mail = {"to": f"order-{order_id}@example.com", "subject": "shipped"}
        await ctx.effect("email.send", partial(http, "POST", f"{base}/email", mail))
    with ctx.step("ship"):
        # A coroutine object: created here, awaited only if the effect really runs.
        shipment = await ctx.effect(
            "warehouse.ship", http("POST", f"{base}/warehouse/shipments", {"order_id": order_id})
        )
    return {"available": stock["available"], "shipment": shipment["shipment_id"]}


async def peek(ctx: replayq.Context, sku: str) -> dict[str, Any]:
    """Reads stock through ``ctx`` (recorded) and once more directly (the seal's business)."""
    base = os.environ[SERVICE_ENV]
    with ctx.step("read"):
        stock = await ctx.call("inventory.get", http, "GET", f"{base}/inventory/{sku}")
    with ctx.step("charge"):
        direct = await http("GET", f"{base}/inventory/{sku}")  # bypasses ctx
    return {"available": stock["available"], "direct": direct["available"]}


def build(url: str | None = None) -> replayq.App:
    return build_on(replayq.App(url))


def build_on(built: replayq.App) -> replayq.App:
    """Declare the job types on ``built`` (the conformance tests' ``app_factory`` apps)."""
    built.job("nap", lease="5s", heartbeat="1s")(nap)
    built.job(
        "notify",
        idempotency="notify:{order_id}",
        retry=replayq.Retry(max_attempts=3, base="0.05s", cap="0.05s"),
    )(notify)
    built.job("peek", retry=replayq.Retry(max_attempts=1))(peek)
    return built


app = build()
