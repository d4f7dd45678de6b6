"""A payment job that handles secrets, for the redaction tests.

``charge`` gets a card number in its payload and passes it, with a bearer token
and a password read from the environment (``GATEWAY_TOKEN``, ``GATEWAY_PASSWORD``),
to a recorded ``ctx.call``; the gateway's answer echoes an API key; the handler
logs the token carelessly; a negative amount makes the gateway fail with an
error that quotes the ``Authorization`` header and the card. Every one of these
must reach the database, the export and the logs only as a redaction marker.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import replayq

log = logging.getLogger("tests.apps.secrets")


def gateway(card: str, amount: int, *, headers: dict[str, str], password: str) -> dict[str, Any]:
    if amount < 0:
        raise RuntimeError(f"gateway refused {headers['Authorization']} for card {card}")
    return {"approved": True, "api_key": f"{password}-session", "last4": card[-5:-1]}


def charge(ctx: replayq.Context, card_number: str, amount: int, note: str = "") -> dict[str, Any]:
    token = os.environ["GATEWAY_TOKEN"]
    answer: dict[str, Any] = ctx.call(
        "gateway",
        gateway,
        card_number,
        amount,
        headers={"Authorization": f"Bearer {token}"},
        password=os.environ["GATEWAY_PASSWORD"],
    )
    log.info("charged with Authorization: Bearer %s", token)
    with ctx.step("capture"):
        ctx.effect("charge.capture", lambda: {"captured": amount, "api_key": answer["api_key"]})
    return {"approved": answer["approved"], "note": note}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job(
        "charge",
        idempotency="charge:{card_number}:{amount}",
        retry=replayq.Retry(max_attempts=1),
    )(charge)
    return built


app = build()
