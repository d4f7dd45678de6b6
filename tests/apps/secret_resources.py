"""A handler whose resources are named by a card number: an entity, a lock, an effect key.

``vault`` reads the card number from its environment (``VAULT_CARD``; a payload's would
reach it as its marker) and keys its own state by it, as an application keys a card's
record: ``ctx.state`` entity ``card:<number>``, a lock ``card-lock:<number>``, an
effect ``tokenize:<number>`` and a cache entry ``card:<number>``. The trace names each
of them as its resource; docs/secrets.md says it stores them redacted, while the
state, the lock, the effect ledger and the cache keep the real key.
"""

from __future__ import annotations

import os
from typing import Any

import replayq


def vault(ctx: replayq.Context, order: int) -> dict[str, Any]:
    card = os.environ["VAULT_CARD"]
    with ctx.step("store"):
        seen = ctx.state.get("card", card)
        uses = (seen.data or {}).get("uses", 0) if seen.exists else 0
        ctx.state.put("card", card, {"order": order, "uses": uses + 1})
    with ctx.step("lock"), ctx.lock(f"card-lock:{card}", ttl="30s"):
        ctx.decide("held", True)
    with ctx.step("tokenize"):
        token = ctx.effect("card.tokenize", lambda: {"token": "tok_1"}, key=f"tokenize:{card}")
        ctx.cache.set("card", card, {"uses": uses + 1})
    return {"uses": uses + 1, "token": token["token"]}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job("vault", retry=replayq.Retry(max_attempts=1))(vault)
    return built


app = build()
