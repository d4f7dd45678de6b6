"""A charge keyed by a field with a default (``tests/acceptance/test_key_defaults.py``).

``charge`` v2's idempotency, ordering and lock templates name ``tenant``, which the
handler defaults to ``"a"``. Its one ``ctx.effect`` has no ``key=``: the key is the
contract's template plus the kind. The effect appends ``effect`` to the side file
``log``, the ground truth of how often it really ran.
"""

from __future__ import annotations

import replayq
from tests.apps.sleepy import record


def charge(
    ctx: replayq.Context, log: str, n: int, order_id: int, tenant: str = "a"
) -> dict[str, int]:
    def effect() -> dict[str, int]:
        record(log, "effect", n, order_id=order_id, tenant=tenant)
        return {"charged_by": n}

    with ctx.step("charge"):
        result: dict[str, int] = ctx.effect("ledger.charge", effect)
    return result


def build(url: str | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); tests build it to enqueue."""
    built = replayq.App(url)
    built.job(
        "charge",
        version="v2",
        idempotency="charge:{order_id}:{tenant}",
        ordering="order:{order_id}:{tenant}",
        lock="tenant:{tenant}",
        effects=["ledger.charge"],
    )(charge)
    return built


app = build()
