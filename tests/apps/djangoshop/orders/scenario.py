"""Enqueue in committed, rolled-back, nested (a savepoint rolled back too) and no ``atomic``
blocks; print what was seen.

Run inside the project: ``manage.py shell -c "import orders.scenario"``. Prints one JSON
line: the jobs a separate connection saw at each point.
"""

import json

from django.db import transaction

from orders.jobs import app
from orders.models import Order
from replayq.contrib.django import enqueue


class Boom(Exception):
    pass


def job_orders() -> list[int]:
    return sorted(job.payload["order_id"] for job in app.list_jobs())


seen: dict[str, object] = {}
try:
    with transaction.atomic():
        rolled = Order.objects.create(status="paid")
        enqueue(app, "confirm_order", {"order_id": rolled.id})
        raise Boom
except Boom:
    pass
seen["after_rollback"] = job_orders()

with transaction.atomic():
    kept = Order.objects.create(status="paid")
    enqueue(app, "confirm_order", {"order_id": kept.id}, message_id=f"order-{kept.id}")
    seen["inside_atomic"] = job_orders()
seen["after_commit"] = job_orders()

with transaction.atomic():
    with transaction.atomic():  # a nested block (savepoint) enqueues with the outer commit
        nested = Order.objects.create(status="paid")
        enqueue(app, "confirm_order", {"order_id": nested.id})
    try:
        with transaction.atomic():
            enqueue(app, "confirm_order", {"order": 0})
    except Exception as exc:  # the payload error, caught: the outer block goes on
        seen["bad_payload"] = type(exc).__name__
seen["after_nested"] = job_orders()

with transaction.atomic():
    saved = Order.objects.create(status="paid")
    try:
        with transaction.atomic():  # a savepoint rolled back: its job goes with it
            enqueue(app, "confirm_order", {"order_id": saved.id}, message_id=f"order-{saved.id}")
            raise Boom
    except Boom:
        pass
    # The message id is free again; inside the outer block the same id is one job.
    again = enqueue(app, "confirm_order", {"order_id": saved.id}, message_id=f"order-{saved.id}")
    twice = enqueue(app, "confirm_order", {"order_id": saved.id}, message_id=f"order-{saved.id}")
    seen["same_id_in_block"] = again == twice
seen["after_savepoint"] = job_orders()

outside = Order.objects.create(status="paid")
enqueue(app, "confirm_order", {"order_id": outside.id})
seen["outside_atomic"] = job_orders()
seen["orders"] = sorted(Order.objects.values_list("id", flat=True))
seen["ids"] = {
    "rolled": rolled.id,
    "kept": kept.id,
    "nested": nested.id,
    "saved": saved.id,
    "outside": outside.id,
}
print(json.dumps(seen))
