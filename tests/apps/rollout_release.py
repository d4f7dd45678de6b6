"""A job type at two versions for ``rollout rollback --release-inflight``: v2 is slow, a
string of steps; v1 is quick. Each run appends its start and end (and each v2 step) to
``$ROLLOUT_SIDE_FILE`` with the version, attempt and time: the ground truth of execution.
"""

from __future__ import annotations

import json
import os
import time

import replayq

STEPS = 40  # v2 takes STEPS x 0.1 s: far longer than the drill, so it is released mid-way


def _record(event: str, n: int, version: str, attempt: int, **extra: object) -> None:
    line = json.dumps(
        {"event": event, "n": n, "version": version, "attempt": attempt, "t": time.time()} | extra
    )
    fd = os.open(os.environ["ROLLOUT_SIDE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _slow_step(n: int, i: int, attempt: int) -> int:
    _record("step", n, "v2", attempt, i=i)
    time.sleep(0.1)
    return i


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)

    @built.job("slow", version="v1", lease="10s", heartbeat="0.2s")
    def slow_v1(ctx: replayq.Context, n: int) -> dict[str, object]:
        _record("start", n, "v1", ctx.attempt)
        _record("end", n, "v1", ctx.attempt)
        return {"n": n, "version": "v1"}

    @built.job("slow", version="v2", lease="10s", heartbeat="0.2s", candidate=True)
    def slow_v2(ctx: replayq.Context, n: int) -> dict[str, object]:
        _record("start", n, "v2", ctx.attempt)
        try:
            for i in range(STEPS):
                ctx.step(f"part-{i}", _slow_step, n, i, ctx.attempt)
        finally:
            _record("end", n, "v2", ctx.attempt)
        return {"n": n, "version": "v2"}

    return built


app = build()
