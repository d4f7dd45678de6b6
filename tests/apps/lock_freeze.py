"""A worker frozen inside a step commit that writes under a lock, for the lock-wait tests.

``hold`` takes ``shelf:1`` and, inside it, writes the entity ``shelf/1`` in a step: the
step's commit is one pipelined transaction (``commit_at_once``) whose fence
(``lock_fence_refusing``) keeps the lock's row ``FOR SHARE`` until it ends. With
``$PIPELINE_FREEZE_JOB`` set to ``n``, ``hold(n)`` arms ``tests/apps/pipeline_freeze.py``'s
hook: the worker stops itself (SIGSTOP) once that commit's statements are sent and its
``COMMIT`` is queued, the row held until the test sends SIGCONT or SIGKILL.

``take`` asks the same lock with a ``wait`` and, holding it, writes ``shelf/1`` too.
"""

from __future__ import annotations

import replayq
from tests.apps import pipeline_freeze

SHELF = "shelf:1"


def hold(ctx: replayq.Context, n: int) -> int:
    with ctx.lock(SHELF, ttl="60s") as lock:
        with ctx.step("write"):
            ctx.state.put("shelf", "1", {"by": "hold", "token": lock.fencing_token})
            if str(n) == pipeline_freeze.FREEZE_JOB and not pipeline_freeze._frozen_once.is_set():
                pipeline_freeze._frozen_once.set()
                pipeline_freeze._armed.on = True  # this step's commit freezes the worker
        assert lock.fencing_token is not None
        return lock.fencing_token


def take(ctx: replayq.Context, wait: float) -> int:
    with ctx.lock(SHELF, ttl="60s", wait=wait) as lock:
        with ctx.step("write"):
            ctx.state.put("shelf", "1", {"by": "take", "token": lock.fencing_token})
        assert lock.fencing_token is not None
        return lock.fencing_token


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    # Leases far longer than the freeze: the test is about the lock, not the lease.
    built.job("hold", lease="60s", heartbeat="5s", retry=replayq.Retry(max_attempts=1))(hold)
    built.job(
        "take",
        lease="60s",
        heartbeat="5s",
        retry=replayq.Retry(max_attempts=20, base="0.5s", cap="0.5s", on=("concurrency",)),
    )(take)
    return built


app = build()
