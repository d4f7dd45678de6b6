"""Job types that make each thing a worker's metrics count happen once, for real.

* ``flaky``: a transient failure on attempt 1, then success (a retry);
* ``doomed``: a validation error (never retried: a dead job);
* ``overrun``: attempt 1 outlives its fixed 1 s lease (a lease expiry, a re-delivery,
  a refused settle); attempt 2 is quick;
* ``lock_overrun``: holds a 0.3 s lock for 0.8 s with no heartbeat to renew it (a lock
  expired before completion);
* ``stale_profile``: caches a profile from user version 1 while the user is at version 2,
  then reads it back (a stale cache read);
* ``notify``: sends one mail per order through ``ctx.effect`` (the second job for the
  same order is deduplicated);
* ``order_event``: per-order events in order (``ordering="order:{order_id}"``); the
  ``create`` of order 13 is invalid and dies, so its ``cancel`` runs out of order;
* ``price_codec``: reads a price that another writer cached in a format this code
  cannot decode (a decode error, read as a miss), then tries to cache a value that is
  not JSON (an encode error, caught by the handler).
"""

from __future__ import annotations

import logging
import time

import replayq

log = logging.getLogger("tests.apps.observed")
FAST_RETRY = replayq.Retry(max_attempts=3, base="10ms", cap="50ms", jitter="none")


def declare(app: replayq.App) -> replayq.App:
    @app.job("flaky", retry=FAST_RETRY)
    def flaky(ctx: replayq.Context, n: int) -> int:
        log.info("flaky attempt %s", ctx.attempt)
        if ctx.attempt == 1:
            raise replayq.TransientError("upstream timed out")
        return n

    @app.job("doomed", retry=FAST_RETRY)
    def doomed(ctx: replayq.Context, reason: str) -> None:
        with ctx.step("check"):
            raise replayq.ValidationError(reason)

    @app.job("overrun", lease="1s", heartbeat=0, retry=FAST_RETRY)
    def overrun(ctx: replayq.Context) -> int:
        if ctx.attempt == 1:
            time.sleep(2.5)
        return ctx.attempt

    @app.job("lock_overrun", lease="10s", heartbeat=0, retry=FAST_RETRY)
    def lock_overrun(ctx: replayq.Context) -> None:
        with ctx.lock("report:1", ttl="0.3s"):
            time.sleep(0.8)

    @app.job("stale_profile", retry=FAST_RETRY)
    def stale_profile(ctx: replayq.Context, user_id: int) -> bool:
        with ctx.step("fill"):
            ctx.cache.set("profile", user_id, {"name": "old"}, version=1, source="user", ttl=300)
        with ctx.step("read"):
            return ctx.cache.get("profile", user_id, source="user").stale

    @app.job("notify", retry=FAST_RETRY, effects=["mail.send"])
    def notify(ctx: replayq.Context, order_id: int) -> str:
        with ctx.step("send"):
            return str(ctx.effect("mail.send", lambda: f"sent {order_id}", key=f"mail:{order_id}"))

    @app.job("order_event", retry=FAST_RETRY, ordering="order:{order_id}")
    def order_event(ctx: replayq.Context, order_id: int, event: str) -> str:
        if event == "create" and order_id == 13:
            raise replayq.ValidationError("order 13 has no lines")
        return event

    @app.job("price_codec", retry=FAST_RETRY)
    def price_codec(ctx: replayq.Context, sku: str) -> bool:
        with ctx.step("read"):
            found = ctx.cache.get("price", sku, version=1)
        with ctx.step("write"):
            try:
                ctx.cache.set("price", sku, {"tags": {"sale"}}, version=1)
            except replayq.PayloadError:
                log.info("price %s not cached: not JSON", sku)
        return found.hit

    return app


app = declare(replayq.App())
