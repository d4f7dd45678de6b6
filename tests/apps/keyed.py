"""Jobs keyed by an order: a contract lock, and an effect under a business idempotency key.

* ``hold``: the contract lock ``order:{order}`` (TTL 2 s, lease 1 s) around the whole
  handler. It appends ``start`` and ``end`` to the side file ``log`` and sleeps
  ``seconds`` between them on its first attempt (``stall_first``) or on every attempt.
  A test SIGKILLs the worker during the sleep: the lock is left to its TTL.
  ``hold_in_order`` is the same handler under ``ordering="order:{order}"``, no lock.
* ``charge`` / ``charge_in_order``: one ``ctx.effect`` with no ``key=``, so the key is
  the contract's template ``charge:{order}`` plus the kind. The effect appends
  ``effect`` to ``log`` (the ground truth of how often it really ran), then sleeps
  ``seconds``. ``charge_retry`` declares the in-doubt policy ``retry`` for the kind;
  ``charge_in_order`` has ``ordering="order:{order}"`` as well. ``charge`` and
  ``charge_retry`` retry patiently (``PATIENT_RETRY``: ~9 s of backoff), long enough to
  wait out another job's effect in flight; ``charge_impatient`` retries as ``hold`` does
  (``QUICK_RETRY``: under a second of backoff), so its attempts run out first.
"""

from __future__ import annotations

import time

import replayq
from tests.apps.sleepy import record

QUICK_RETRY = replayq.Retry(max_attempts=5, base="0.05s", cap="0.2s")
# 20 attempts, waits of 0.1, 0.2, 0.4 then 0.5 s (no jitter): ~8.7 s in all.
PATIENT_RETRY = replayq.Retry(max_attempts=20, base="0.1s", cap="0.5s", jitter="none")
SHORT_LEASE = {"lease": "1s", "heartbeat": "0.3s"}


def hold(
    ctx: replayq.Context, log: str, n: int, order: str, seconds: float, stall_first: bool
) -> dict[str, int]:
    record(log, "start", n, order=order, attempt=ctx.attempt)
    if not stall_first or ctx.attempt == 1:
        time.sleep(seconds)
    record(log, "end", n, order=order, attempt=ctx.attempt)
    return {"n": n}


def charge(ctx: replayq.Context, log: str, n: int, order: str, seconds: float) -> dict[str, int]:
    def effect() -> dict[str, int]:
        record(log, "effect", n, order=order)
        time.sleep(seconds)
        return {"charged_by": n}

    with ctx.step("charge"):
        result: dict[str, int] = ctx.effect("ledger.charge", effect)
    return result


def build(url: str | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); tests build it to enqueue."""
    built = replayq.App(url)
    built.job("hold", lock="order:{order}", lock_ttl="2s", retry=QUICK_RETRY, **SHORT_LEASE)(hold)
    built.job("hold_in_order", ordering="order:{order}", retry=QUICK_RETRY, **SHORT_LEASE)(hold)
    built.job("charge", idempotency="charge:{order}", retry=PATIENT_RETRY, **SHORT_LEASE)(charge)
    built.job(
        "charge_retry",
        idempotency="charge:{order}",
        effects={"ledger.charge": "retry"},
        retry=PATIENT_RETRY,
        **SHORT_LEASE,
    )(charge)
    built.job("charge_impatient", idempotency="charge:{order}", retry=QUICK_RETRY, **SHORT_LEASE)(
        charge
    )
    built.job(
        "charge_in_order",
        idempotency="charge:{order}",
        ordering="order:{order}",
        retry=QUICK_RETRY,
        **SHORT_LEASE,
    )(charge)
    return built


app = build()
