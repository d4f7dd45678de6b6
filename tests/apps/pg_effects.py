"""Jobs for the PostgreSQL chaos tests: one real side effect per job, counted in a file.

``charge`` sleeps, then makes one effect behind ``ctx.effect`` with the business
key ``charge:{n}``. The effect appends one JSON line to the ``sink`` file: that
file, not the queue's tables, is the ground truth of how often an effect really
happened. ``probe`` only records when it started (pickup latency).
"""

from __future__ import annotations

import os
import time

import replayq
from tests.apps.sleepy import record

RETRY = replayq.Retry(max_attempts=20, base="0.05s", cap="0.5s")


def charge(ctx: replayq.Context, n: int, sink: str, seconds: float = 0.0) -> dict[str, int]:
    if seconds:
        time.sleep(seconds)

    def effect() -> dict[str, int]:
        record(sink, "effect", n)
        return {"charged": n}

    return ctx.effect("ledger.charge", effect, key=f"charge:{n}")


def touch(ctx: replayq.Context, n: int, sink: str, seconds: float = 0.0) -> None:
    """No effect: one line when it starts and one when it ends (executions, not effects)."""
    record(sink, "start", n)
    time.sleep(seconds)
    record(sink, "end", n)


def probe(ctx: replayq.Context, n: int, sink: str) -> None:
    record(sink, "probe", n)


def build(url: str | None = None, *, auto_migrate: bool | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); ``$PG_EFFECTS_LEASE`` or 2s."""
    built = replayq.App(url, auto_migrate=auto_migrate)
    lease = os.environ.get("PG_EFFECTS_LEASE", "2s")
    built.job("touch", lease=lease, heartbeat="0.5s", retry=RETRY)(touch)
    built.job("charge", lease=lease, heartbeat="0.5s", retry=RETRY)(charge)
    built.job("probe", lease=lease, heartbeat="0.5s", retry=RETRY)(probe)
    return built


app = build()
