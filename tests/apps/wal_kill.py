"""Jobs that each write one entity and log their run to a side file: the ground truth of
which handlers ran, read by ``tests/acceptance/test_sqlite_kill_wal.py``."""

from __future__ import annotations

import time

import replayq
from tests.apps.sleepy import QUICK_RETRY, record


def tally(ctx: replayq.Context, log: str, n: int) -> dict[str, int]:
    """Log ``start``, write entity ``tally/n`` once in a step, log ``end``."""
    record(log, "start", n, attempt=ctx.attempt)
    time.sleep(0.01)
    with ctx.step("note"):
        ctx.state.put("tally", str(n), {"n": n})
    record(log, "end", n, attempt=ctx.attempt)
    return {"n": n}


def build(url: str | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); the test builds it to enqueue."""
    built = replayq.App(url)
    built.job("tally", retry=QUICK_RETRY, lease="1s", heartbeat="0.3s")(tally)
    return built


app = build()
