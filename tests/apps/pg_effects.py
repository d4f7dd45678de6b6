"""Jobs for the PostgreSQL chaos tests: one real side effect per job, counted outside.

``charge`` sleeps, then makes one effect behind ``ctx.effect`` with the business
key ``charge:{n}``. The effect is counted where the queue cannot touch it: a
``POST /effects/<n>`` to the counting HTTP server of ``tests/services.py`` (when
``$REPLAYQ_TEST_SERVICE`` names it; the chaos checker reads its counts), then one
JSON line appended to the ``sink`` file. ``ordered_charge`` is ``charge`` under the
ordering key ``account:{account}``. ``probe`` only records when it started (pickup
latency).
"""

from __future__ import annotations

import os
import time

import replayq
from tests.apps.counting import count_effect
from tests.apps.sleepy import record
from tests.apps.storage_faults import OffsetClock

RETRY = replayq.Retry(max_attempts=20, base="0.05s", cap="0.5s")


def charge(ctx: replayq.Context, n: int, sink: str, seconds: float = 0.0) -> dict[str, int]:
    if seconds:
        time.sleep(seconds)

    def effect() -> dict[str, int]:
        count_effect(str(n))
        record(sink, "effect", n)
        return {"charged": n}

    return ctx.effect("ledger.charge", effect, key=f"charge:{n}")


def ordered_charge(
    ctx: replayq.Context, n: int, sink: str, account: int, seconds: float = 0.0
) -> dict[str, int]:
    """``charge`` under the ordering key ``account:{account}``: one at a time per account,
    in enqueue order (the checker's order-violation row)."""
    return charge(ctx, n, sink, seconds)


def touch(ctx: replayq.Context, n: int, sink: str, seconds: float = 0.0) -> None:
    """No effect: one line when it starts and one when it ends (executions, not effects)."""
    record(sink, "start", n)
    time.sleep(seconds)
    record(sink, "end", n)


def probe(ctx: replayq.Context, n: int, sink: str) -> None:
    record(sink, "probe", n)


def build(url: str | None = None, *, auto_migrate: bool | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); ``$PG_EFFECTS_LEASE`` or 2s;
    ``$CHAOS_CLOCK_OFFSET`` seconds on its wall clock (a host whose clock is off)."""
    offset = float(os.environ.get("CHAOS_CLOCK_OFFSET", "0"))
    built = replayq.App(
        url, auto_migrate=auto_migrate, clock=OffsetClock(offset) if offset else None
    )
    lease = os.environ.get("PG_EFFECTS_LEASE", "2s")
    built.job("touch", lease=lease, heartbeat="0.5s", retry=RETRY)(touch)
    built.job("charge", lease=lease, heartbeat="0.5s", retry=RETRY)(charge)
    built.job(
        "ordered_charge",
        lease=lease,
        heartbeat="0.5s",
        retry=RETRY,
        ordering="account:{account}",
    )(ordered_charge)
    built.job("probe", lease=lease, heartbeat="0.5s", retry=RETRY)(probe)
    return built


app = build()
