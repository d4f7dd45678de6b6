"""``quote`` at two versions for a plain ``rollout rollback`` under a running attempt: v2
waits until the file ``$ROLLOUT_GO`` exists, then fails (transient); v1 succeeds at once.
Each run appends its start and end to ``$ROLLOUT_SIDE_FILE`` with the version and attempt:
the ground truth of which version ran."""

from __future__ import annotations

import os
import time
from pathlib import Path

import replayq
from tests.apps.sleepy import record

QUICK_RETRY = replayq.Retry(max_attempts=3, base="0.05s", cap="0.1s")


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    side = os.environ.get("ROLLOUT_SIDE_FILE", os.devnull)

    @built.job("quote", version="v1", lease="2s", heartbeat="0.2s", retry=QUICK_RETRY)
    def quote_v1(ctx: replayq.Context, n: int) -> dict[str, object]:
        record(side, "start", n, version="v1", attempt=ctx.attempt)
        record(side, "end", n, version="v1", attempt=ctx.attempt)
        return {"n": n, "version": "v1"}

    @built.job(
        "quote", version="v2", lease="2s", heartbeat="0.2s", retry=QUICK_RETRY, candidate=True
    )
    def quote_v2(ctx: replayq.Context, n: int) -> dict[str, object]:
        record(side, "start", n, version="v2", attempt=ctx.attempt)
        go = Path(os.environ["ROLLOUT_GO"])
        while not go.exists():
            time.sleep(0.05)
        record(side, "end", n, version="v2", attempt=ctx.attempt)
        raise replayq.TransientError("v2 fails after the rollback")

    return built


app = build()
