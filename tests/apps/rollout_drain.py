"""A job type at two versions for the rollback drill: each run appends its start and end,
with the version and attempt, to ``$ROLLOUT_SIDE_FILE`` (the ground truth of execution).

Every tenth job fails its first attempt with a transient error on either version, so
retries are flowing before, during and after a rollback, at a rate set by the jobs,
not by the version.
"""

from __future__ import annotations

import json
import os
import time

import replayq

RETRY = replayq.Retry(max_attempts=3, base="0.05s", cap="0.1s", on=("transient",))


def _record(event: str, n: int, version: str, attempt: int) -> None:
    line = json.dumps(
        {
            "event": event,
            "n": n,
            "version": version,
            "attempt": attempt,
            "t": time.time(),
            "pid": os.getpid(),
        }
    )
    fd = os.open(os.environ["ROLLOUT_SIDE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _run(ctx: replayq.Context, n: int, version: str) -> dict[str, object]:
    _record("start", n, version, ctx.attempt)
    time.sleep(0.02)
    if n % 10 == 0 and ctx.attempt == 1:
        _record("fail", n, version, ctx.attempt)
        raise replayq.TransientError("upstream timed out")
    _record("end", n, version, ctx.attempt)
    return {"n": n, "version": version}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)

    @built.job("drain", version="v1", retry=RETRY, lease="10s")
    def drain_v1(ctx: replayq.Context, n: int) -> dict[str, object]:
        return _run(ctx, n, "v1")

    @built.job("drain", version="v2", retry=RETRY, lease="10s", candidate=True)
    def drain_v2(ctx: replayq.Context, n: int) -> dict[str, object]:
        return _run(ctx, n, "v2")

    return built


app = build()
