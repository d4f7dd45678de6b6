"""A job whose effect can be caught in the act: it marks its start, then takes its time.

``charge`` runs one ``ctx.effect`` under the business key ``charge:{n}``. The effect
appends a line to ``sink`` (the ground truth of how often it really ran) and then
sleeps ``$EFFECT_KILL_SECONDS`` (default 0): a test that sees the line can SIGKILL
that worker between the idempotency claim and the recorded result. The effect kind keeps the default
in-doubt policy, ``park``.
"""

from __future__ import annotations

import os
import time

import replayq
from tests.apps.sleepy import record


def charge(ctx: replayq.Context, n: int, sink: str) -> dict[str, int]:
    def effect() -> dict[str, int]:
        record(sink, "effect", n)
        time.sleep(float(os.environ.get("EFFECT_KILL_SECONDS", "0")))
        return {"charged": n}

    with ctx.step("charge"):
        result: dict[str, int] = ctx.effect("ledger.charge", effect)
    return result


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job(
        "charge",
        idempotency="charge:{n}",
        lease="1s",
        heartbeat="0.3s",
        retry=replayq.Retry(max_attempts=5, base="0.05s", cap="0.2s"),
    )(charge)
    return built


app = build()
