"""A payload declared as a ``msgspec.Struct``, on both backends: validated at enqueue with
the field named, stored in its JSON form, and given back exactly — to the handler, in the
trace and in a dry-run; a malformed one that reaches a worker is parked, never retried."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

import replayq
from replayq.model import JobState
from replayq.replay.engine import dry_run
from replayq.testing import run_inline
from replayq.worker import Worker
from tests.apps import typed_structs
from tests.apps.typed_orders import seen
from tests.apps.typed_structs import Invoice, Item
from tests.replay_support import derived_events

AppFactory = Callable[..., replayq.App]
INVOICE = uuid.UUID("0b7e4d2c-91a3-4f6e-8c55-3d2a1f0e9b77")
AT = datetime(2026, 11, 30, 21, 15, 7, 123456, tzinfo=timezone(timedelta(hours=-3)))
GIVEN = Invoice(INVOICE, Decimal("1234.50"), AT, [Item("sku-1", 2), Item("sku-2", 1)])


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    return typed_structs.declare(app_factory())


def recorded(events: list[replayq.TraceEvent]) -> str:
    (value,) = [e.data["value"] for e in events if e.name == "decision"]
    return str(value)


def test_a_struct_payload_round_trips_through_handler_trace_and_dry_run(
    app: replayq.App,
) -> None:
    job = run_inline(app, "bill", GIVEN)

    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.payload == {
        "invoice_id": str(INVOICE),
        "total": "1234.50",
        "issued": "2026-11-30T21:15:07.123456-03:00",
        "items": [{"sku": "sku-1", "qty": 2}, {"sku": "sku-2", "qty": 1}],
        "note": None,
    }
    assert recorded(app.trace(job.id)) == seen(GIVEN)
    assert job.result == {"total": "1234.50", "items": 2}

    report = dry_run(app, job.id)
    assert not report.diverged, report.to_dict()
    assert recorded(derived_events(app, report.trace_id)) == seen(GIVEN)


def test_its_json_form_enqueued_gives_the_handler_the_same_struct(app: replayq.App) -> None:
    first = run_inline(app, "bill", GIVEN)
    again = run_inline(app, "bill", dict(first.payload))

    assert again.payload == first.payload
    assert recorded(app.trace(again.id)) == seen(GIVEN)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"total": "a lot"}, r"bill: field 'total': Invalid decimal string"),
        (
            {"items": [{"sku": "sku-1", "qty": "2"}]},
            r"bill: field 'items\[0\]\.qty': Expected `int`",
        ),
        (
            {"items": [{"sku": "sku-1"}]},
            r"bill: payload is missing required field 'items\[0\]\.qty'",
        ),
        ({"issued": "yesterday"}, r"bill: field 'issued': Invalid RFC3339"),
    ],
)
def test_a_wrong_field_at_enqueue_is_named_and_nothing_is_enqueued(
    app: replayq.App, change: dict[str, object], message: str
) -> None:
    payload = {**run_inline(app, "bill", GIVEN).payload, **change}
    before = len(app.list_jobs(job_type="bill", limit=100))

    with pytest.raises(replayq.PayloadError, match=message):
        app.enqueue("bill", payload)
    assert len(app.list_jobs(job_type="bill", limit=100)) == before


def test_an_invalid_struct_instance_is_refused_too(app: replayq.App) -> None:
    # msgspec's constructor checks nothing; replayq checks the instance's JSON form.
    with pytest.raises(replayq.PayloadError, match=r"bill: field 'items\[0\]\.qty'"):
        app.enqueue("bill", Invoice(INVOICE, Decimal("1"), AT, [Item("sku-1", "2")]))  # type: ignore[arg-type]


def test_a_malformed_struct_payload_reaching_a_worker_is_parked_not_retried(
    app: replayq.App, app_factory: AppFactory
) -> None:
    bad = {**run_inline(app, "bill", GIVEN).payload, "total": 12.3}
    bad["items"] = [{"sku": "sku-1", "qty": "many"}]
    job_id = app_factory().enqueue("bill", bad, check=False)

    Worker(app, burst=True, worker_id="w-struct", scheduler=False).run()
    job = app.get_job(job_id)

    assert job.state == JobState.DEAD
    assert job.attempt == 1
    assert job.dead_reason == "malformed_payload"
    assert "field 'items[0].qty': Expected `int`, got `str`" in (job.last_error or "")


def test_msgspec_rules_apply_a_float_decimal_is_taken_and_an_unknown_field_dropped(
    app: replayq.App,
) -> None:
    payload = {**run_inline(app, "bill", GIVEN).payload, "total": 0.1, "extra": "x"}
    job = run_inline(app, "bill", payload)

    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.payload["total"] == "0.1"
    assert "extra" not in job.payload
