"""A whole payload declared as a ``msgspec.Struct`` (extra ``msgspec``): money as
``Decimal``, time as an aware ``datetime``, an id as ``UUID``, nested Structs, an
``Optional``. The handler records what it received as a decision (type and ``repr``),
so a dry-run that gave it anything else would diverge there.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec

import replayq
from tests.apps.typed_orders import seen


class Item(msgspec.Struct, frozen=True):
    sku: str
    qty: int


class Invoice(msgspec.Struct, frozen=True):
    invoice_id: uuid.UUID
    total: Decimal
    issued: datetime
    items: list[Item]
    note: str | None = None


def bill(ctx: replayq.Context, invoice: Invoice) -> dict[str, Any]:
    with ctx.step("receive"):
        ctx.decide("invoice", seen(invoice))
    return {"total": str(invoice.total), "items": len(invoice.items)}


def declare(app: replayq.App) -> replayq.App:
    app.job("bill", retry=replayq.Retry(max_attempts=3, base="10ms", cap="10ms"))(bill)
    return app


app = declare(replayq.App())
