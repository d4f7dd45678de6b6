"""What typed payloads cost per job: the enqueue check and encode, and the worker's decode.

Three handlers with the same fields, in one process, no database (the cost is
Python, before and after the SQL):

* ``untyped``: ``order_id: int, amount: float, at: str, lines: list`` — the path
  every payload took before types (stored as it is, no copy);
* ``typed``: ``order_id: UUID, amount: Decimal, at: datetime, lines: list[Line]``
  with ``Line`` a dataclass of two fields, three lines;
* ``model``: the same fields as one pydantic model (the whole payload).

Per side: ``Handler.prepare_payload`` (what ``app.enqueue`` runs) and
``PayloadShape.decode`` of the stored JSON (what the worker and a dry-run run
before calling the handler), best of ``--repeat`` timeit runs of ``--number``.

    python benchmarks/payload_types.py [--number 20000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pydantic
from machine import machine

from replayq import codec
from replayq.queue.contracts import build_contract
from replayq.queue.handlers import Handler, PayloadShape


@dataclass
class Line:
    sku: str
    qty: int


class Order(pydantic.BaseModel):
    order_id: uuid.UUID
    amount: Decimal
    at: datetime
    lines: list[Line]


def untyped(ctx: Any, order_id: int, amount: float, at: str, lines: list) -> None: ...  # type: ignore[type-arg]


def typed(
    ctx: Any, order_id: uuid.UUID, amount: Decimal, at: datetime, lines: list[Line]
) -> None: ...


def model(ctx: Any, order: Order) -> None: ...


AT = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
LINES = [Line("sku-1", 2), Line("sku-2", 1), Line("sku-3", 5)]
PAYLOADS: dict[str, Any] = {
    "untyped": {
        "order_id": 123,
        "amount": 12.3,
        "at": AT.isoformat(),
        "lines": [vars(x) for x in LINES],
    },
    "typed": {"order_id": uuid.uuid4(), "amount": Decimal("12.30"), "at": AT, "lines": LINES},
    "model": Order(order_id=uuid.uuid4(), amount=Decimal("12.30"), at=AT, lines=LINES),
}


def handler(fn: Any) -> Handler:
    shape = PayloadShape.from_function(fn)
    contract = build_contract(fn.__name__, fields=shape.fields, payload_schema=shape.schema())
    return Handler(contract, fn, shape, {})


def measure(number: int, repeat: int) -> dict[str, dict[str, float]]:
    results = {}
    for name, fn in (("untyped", untyped), ("typed", typed), ("model", model)):
        built, payload = handler(fn), PAYLOADS[name]
        stored = codec.loads(built.prepare_payload(payload)[1])
        enqueue = min(
            timeit.repeat(partial(built.prepare_payload, payload), number=number, repeat=repeat)
        )
        decode = min(
            timeit.repeat(partial(built.shape.decode, name, stored), number=number, repeat=repeat)
        )
        results[name] = {
            "enqueue_us": round(enqueue / number * 1e6, 2),
            "decode_us": round(decode / number * 1e6, 2),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results = measure(args.number, args.repeat)
    facts = machine(Path.cwd())
    if args.json:
        print(json.dumps({"results": results, "machine": dict(facts)}, indent=2))
        return 0
    for key, value in facts:
        print(f"{key:<10} {value}")
    print(f"\n{'payload':<10} {'enqueue µs':>12} {'decode µs':>12}")
    for name, row in results.items():
        print(f"{name:<10} {row['enqueue_us']:>12} {row['decode_us']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
