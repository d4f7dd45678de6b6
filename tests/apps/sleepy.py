"""Jobs that sleep and write what they did to a side file the test reads.

The side file is the ground truth of *execution* (as opposed to the job row,
which is the queue's claim about it): one JSON line per start and per end,
with the worker's pid and wall-clock time.
"""

from __future__ import annotations

import json
import os
import time

import replayq

SHORT_LEASE = {"lease": "1s", "heartbeat": "0.3s"}
# Far longer than any test waits: a job that comes back quickly was released, not reaped.
LONG_LEASE = {"lease": "120s", "heartbeat": "40s"}
QUICK_RETRY = replayq.Retry(max_attempts=5, base="0.05s", cap="0.2s")


def record(log: str, event: str, n: int, **extra: object) -> None:
    """Append one line; ``O_APPEND`` keeps lines from concurrent processes whole."""
    line = json.dumps({"event": event, "n": n, "pid": os.getpid(), "t": time.time(), **extra})
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def sleep(ctx: replayq.Context, log: str, n: int, seconds: float) -> dict[str, int]:
    """Sleep ``seconds``. With ``$SLEEPY_LATE_OUTCOME=fail`` the run fails when it wakes."""
    record(log, "start", n)
    time.sleep(seconds)
    if os.environ.get("SLEEPY_LATE_OUTCOME") == "fail":
        record(log, "fail", n)
        raise replayq.TransientError("failing on purpose after the sleep")
    record(log, "end", n)
    return {"n": n, "pid": os.getpid()}


def sleep_in_order(
    ctx: replayq.Context, log: str, n: int, account: str, seconds: float
) -> dict[str, int]:
    """Like ``sleep``, but jobs of one account run one at a time, in enqueue order."""
    record(log, "start", n, account=account)
    time.sleep(seconds)
    record(log, "end", n, account=account)
    return {"n": n, "pid": os.getpid()}


def nap_then_call(ctx: replayq.Context, log: str, n: int, naps: int) -> dict[str, int]:
    """Nap ``naps`` times 0.1 s (a worker frozen meanwhile has the rest to nap when it is
    thawed: its heartbeat beats first), then make one call through ``ctx``: the call writes
    ``call`` to the side file; a call refused for a lost lease writes ``stopped``."""
    record(log, "start", n)
    for _ in range(naps):
        time.sleep(0.1)
    try:
        ctx.call("side_effect", record, log, "call", n)
    except replayq.LeaseLostError:
        record(log, "stopped", n)
        raise
    record(log, "end", n)
    return {"n": n, "pid": os.getpid()}


def build(url: str | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); tests build it to enqueue."""
    built = replayq.App(url)
    built.job("sleep", retry=QUICK_RETRY, **SHORT_LEASE)(sleep)
    built.job("sleep_long_lease", retry=QUICK_RETRY, **LONG_LEASE)(sleep)
    built.job("nap_then_call", retry=QUICK_RETRY, **SHORT_LEASE)(nap_then_call)
    built.job("sleep_in_order", ordering="account:{account}", retry=QUICK_RETRY, **SHORT_LEASE)(
        sleep_in_order
    )
    return built


app = build()
