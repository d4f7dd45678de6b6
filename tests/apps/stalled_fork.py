"""A handler a fork runs in place of ``storage_faults.deliver`` that never gets far: it
sleeps inside its first step, so the ``replayq fork`` process holds its source job
(``rq_gc_holds``) until the test kills it (``tests/acceptance/test_gc_hold_killed.py``)."""

from __future__ import annotations

import time

import replayq


def stall(ctx: replayq.Context, n: int, sink: str) -> None:
    with ctx.step("deliver"):
        time.sleep(60)
