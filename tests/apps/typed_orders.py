"""Typed payloads: money as ``Decimal``, time as an aware ``datetime``, ids as ``UUID``, an
enum, a list of dataclasses, an ``Optional`` — and a whole payload as one dataclass.

Each handler records what it received as decisions (``repr`` of each value), so a
dry-run that gave the handler anything else would diverge at that decision.
``declare(app)`` puts the job types on any ``App``; the module's ``app`` is for the
CLI (``--app tests.apps.typed_orders:app``, ``--db`` sets its URL).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import replayq


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"


@dataclass(frozen=True)
class Line:
    sku: str
    qty: int


@dataclass(frozen=True)
class Refund:
    order_id: uuid.UUID
    amount: Decimal
    at: datetime
    lines: list[Line] = field(default_factory=list)


def seen(value: Any) -> str:
    """What a handler records of a value: its type and exact repr."""
    return f"{type(value).__name__}:{value!r}"


def charge(
    ctx: replayq.Context,
    order_id: uuid.UUID,
    amount: Decimal,
    at: datetime,
    currency: Currency,
    lines: list[Line],
    note: str | None = None,
) -> dict[str, Any]:
    with ctx.step("receive"):
        for name, value in (("amount", amount), ("at", at), ("order_id", order_id)):
            ctx.decide(name, seen(value))
        ctx.decide("currency", seen(currency))
        ctx.decide("lines", [seen(line) for line in lines])
        ctx.decide("note", seen(note))
    total = sum((Decimal(line.qty) for line in lines), Decimal(0)) * amount
    return {"total": str(total), "at": at.isoformat()}


def refund(ctx: replayq.Context, refund: Refund) -> dict[str, Any]:
    with ctx.step("receive"):
        ctx.decide("refund", seen(refund))
    return {"amount": str(refund.amount)}


def reorder(ctx: replayq.Context, order_id: uuid.UUID, amount: Decimal) -> None:
    """Enqueues a ``charge`` child with typed values, as a producer would."""
    with ctx.step("enqueue"):
        ctx.enqueue(
            "charge",
            {
                "order_id": order_id,
                "amount": amount,
                "at": datetime.fromisoformat("2026-12-01T09:00:00+01:00"),
                "currency": Currency.USD,
                "lines": [Line("sku-9", 1)],
            },
        )


def declare(app: replayq.App) -> replayq.App:
    one = replayq.Retry(max_attempts=3, base="10ms", cap="10ms")
    app.job("charge", retry=one, idempotency="charge:{order_id}:{amount}")(charge)
    app.job("refund", retry=one)(refund)
    app.job("reorder", retry=one)(reorder)
    return app


app = declare(replayq.App())
