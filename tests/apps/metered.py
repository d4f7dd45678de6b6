"""Job types whose retries, burial and child enqueues a worker's metrics must count once each.

* ``wobbly``: a transient failure on attempts 1 and 2, success on 3;
* ``worn_out``: a transient failure on every attempt: dead after 3 (``attempts_exhausted``);
* ``fan_out``: enqueues its ``child`` with a message id the test already took (a
  deduplicated enqueue, in the worker's own process).

Every error message carries a fresh token: a message that became a label value would
show as a new series per failure.
"""

from __future__ import annotations

import uuid

import replayq

FAST_RETRY = replayq.Retry(max_attempts=3, base="10ms", cap="50ms", jitter="none")


def declare(app: replayq.App) -> replayq.App:
    @app.job("wobbly", retry=FAST_RETRY)
    def wobbly(ctx: replayq.Context, n: int) -> int:
        if ctx.attempt < 3:
            raise replayq.TransientError(f"upstream timed out (request {uuid.uuid4()})")
        return n

    @app.job("worn_out", retry=FAST_RETRY)
    def worn_out(ctx: replayq.Context) -> None:
        raise replayq.TransientError(f"upstream timed out (request {uuid.uuid4()})")

    @app.job("fan_out", retry=FAST_RETRY)
    def fan_out(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("children"):
            ctx.enqueue("child", {"order_id": order_id}, message_id=f"child-{order_id}")

    @app.job("child", retry=FAST_RETRY)
    def child(ctx: replayq.Context, order_id: int) -> int:
        return order_id

    return app


app = declare(replayq.App())
