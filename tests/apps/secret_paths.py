"""A handler that puts secrets where replayq's own fields and the logs carry them.

``probe`` reads a bearer token (``PROBE_TOKEN``) and a password (``PROBE_PASSWORD``)
from its environment, as docs/secrets.md tells a handler to, and then is careless
with them: the token is in a step's name (every event of the step carries it), a
card number and the token are object keys of a call's arguments and answer and of an
effect's result, the password is nested deep in a call's arguments, a child job's
payload and a decision, and the handler logs the token at WARNING, with a traceback
that quotes it. ``mode="fail"`` ends in an error quoting the token and a database URL
with the password. A dry-run or fork reads the environment again: the same secrets
reach the handler, and its log lines reach the CLI's stderr.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import replayq

log = logging.getLogger("tests.apps.secret_paths")
CARD = "4111111111111111"


def gateway(request: dict[str, Any]) -> dict[str, Any]:
    token = os.environ["PROBE_TOKEN"]
    return {"sessions": {f"Bearer {token}": "active"}, "cards": {CARD: "visa"}}


def probe(ctx: replayq.Context, order: int, mode: str = "ok") -> dict[str, Any]:
    token, password = os.environ["PROBE_TOKEN"], os.environ["PROBE_PASSWORD"]
    with ctx.step(f"auth Bearer {token}"):
        ctx.call("gateway", gateway, {"cards": {CARD: 1}, "deep": [[{"password": password}]]})
    with ctx.step("decide"):
        ctx.decide("route", {"password": password}, why=f"Bearer {token}")
    with ctx.step("book"):
        ctx.effect("ledger.book", lambda: {CARD: f"Basic {token}"}, key=f"book:{order}")
        ctx.enqueue("child", {"password": password, "nested": {"client_secret": password}})
    try:
        raise RuntimeError(f"gateway hiccup for Bearer {token}")
    except RuntimeError:
        log.exception("retrying with Authorization: Bearer %s", token)
    if mode == "fail":
        raise RuntimeError(f"gateway said Bearer {token} at postgresql://u:{password}@h/db")
    return {"ok": True}


def child(ctx: replayq.Context, password: str, nested: dict[str, Any]) -> None:
    return None


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("probe", retry=replayq.Retry(max_attempts=1))(probe)
    built.job("child", retry=replayq.Retry(max_attempts=1))(child)
    return built


app = build()
