"""Typed payloads on both backends: exact values from enqueue to the handler, the trace and a
dry-run; a wrong type refused at enqueue naming the field; a bad payload that reaches a
worker parked with its reason, never retried."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import replayq
from replayq.model import JobState
from replayq.replay.engine import dry_run
from replayq.testing import run_inline
from replayq.worker import Worker
from tests.apps import typed_orders
from tests.apps.typed_orders import Currency, Line, Refund, seen
from tests.replay_support import cli, cli_ok, derived_events

AppFactory = Callable[..., replayq.App]
ORDER = uuid.UUID("6f1c2a9e-5d0b-4c1e-9a63-2b7e8f0d4c11")
AT = datetime(2026, 11, 30, 21, 15, 7, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    return typed_orders.declare(app_factory())


def charge_payload(**changes: Any) -> dict[str, Any]:
    payload = {
        "order_id": ORDER,
        "amount": Decimal("12.30"),
        "at": AT,
        "currency": Currency.EUR,
        "lines": [Line("sku-1", 2), Line("sku-2", 1)],
    }
    return {**payload, **changes}


def decisions(events: list[replayq.TraceEvent]) -> dict[str, Any]:
    return {e.data["decision"]: e.data["value"] for e in events if e.name == "decision"}


def trace(app: replayq.App, job_id: int) -> list[replayq.TraceEvent]:
    return app.trace(job_id)


def test_decimal_and_aware_datetime_survive_enqueue_handler_trace_and_dry_run(
    app: replayq.App,
) -> None:
    job = run_inline(app, "charge", charge_payload())

    assert job.state == JobState.SUCCEEDED, job.last_error
    # Stored: the canonical JSON form, exact (no float), offset kept.
    assert job.payload["amount"] == "12.30"
    assert job.payload["at"] == "2026-11-30T21:15:07.123456+05:30"
    assert job.payload["order_id"] == str(ORDER)
    assert job.idempotency_key == f"charge:{ORDER}:12.30"
    # The handler got the exact values back.
    recorded = decisions(trace(app, job.id))
    assert recorded["amount"] == "Decimal:Decimal('12.30')"
    assert recorded["at"] == f"datetime:{AT!r}"
    assert recorded["order_id"] == f"UUID:{ORDER!r}"
    assert recorded["currency"] == "Currency:<Currency.EUR: 'EUR'>"
    assert recorded["lines"] == [seen(Line("sku-1", 2)), seen(Line("sku-2", 1))]
    assert recorded["note"] == "NoneType:None"
    assert job.result == {"total": "36.90", "at": AT.isoformat()}
    enqueued = next(e for e in trace(app, job.id) if e.name == "job.enqueued")
    assert enqueued.job_id == job.id

    # Dry-run: the handler runs again from the stored payload and decides the same.
    report = dry_run(app, job.id)
    assert not report.diverged, report.to_dict()
    assert decisions(derived_events(app, report.trace_id)) == recorded
    assert report.outcome_now is not None and report.outcome_now.result == job.result


def test_dry_run_through_the_cli_of_a_typed_job_reports_no_divergence(app: replayq.App) -> None:
    job = run_inline(app, "charge", charge_payload(note="gift"))

    shown = cli_ok(
        app.url, "replay", str(job.id), "--mode", "dry-run", "--app", "tests.apps.typed_orders:app"
    )
    timeline = cli_ok(app.url, "trace", "show", str(job.id)).stdout

    assert "no divergence" in shown.stdout
    assert "Decimal('12.30')" in timeline
    assert "'gift'" in timeline


def test_a_zoneinfo_datetime_comes_back_as_the_same_instant_and_offset(app: replayq.App) -> None:
    paris = datetime(2026, 3, 29, 3, 30, tzinfo=ZoneInfo("Europe/Paris"))  # just after DST
    job = run_inline(app, "charge", charge_payload(at=paris))

    got = decisions(trace(app, job.id))["at"]
    assert job.payload["at"] == "2026-03-29T03:30:00+02:00"
    assert got == f"datetime:{datetime(2026, 3, 29, 3, 30, tzinfo=timezone(timedelta(hours=2)))!r}"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"amount": 12.3}, r"field 'amount' expects Decimal, got float 12\.3 \(a float is not"),
        ({"amount": "twelve"}, r"field 'amount' expects Decimal, got str 'twelve'"),
        ({"amount": "NaN"}, r"field 'amount' expects a finite Decimal"),
        ({"at": datetime(2026, 1, 1)}, r"field 'at' expects a timezone-aware datetime"),
        ({"at": "yesterday"}, r"field 'at' expects an ISO 8601 datetime"),
        ({"order_id": "not-a-uuid"}, r"field 'order_id' expects UUID"),
        ({"currency": "GBP"}, r"field 'currency' expects Currency \(one of 'EUR', 'USD'\)"),
        (
            {"lines": [Line("a", 1), {"sku": "b", "qty": "2"}]},
            r"field 'lines\[1\]\.qty' expects int",
        ),
        ({"lines": [{"sku": "b"}]}, r"missing required field 'lines\[0\]\.qty'"),
        (
            {"lines": [{"sku": "b", "qty": 1, "colour": "red"}]},
            r"unknown field 'lines\[0\]\.colour'",
        ),
        ({"lines": (1, 2)}, r"field 'lines\[0\]' expects Line"),
        ({"note": 7}, r"field 'note' expects str, got int 7"),
    ],
)
def test_a_wrong_type_at_enqueue_names_the_field_and_enqueues_nothing(
    app: replayq.App, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(replayq.PayloadError, match=message):
        app.enqueue("charge", charge_payload(**changes))
    assert app.list_jobs() == []


def test_a_malformed_typed_payload_reaching_a_worker_is_parked_with_its_reason_not_retried(
    app: replayq.App, app_factory: AppFactory
) -> None:
    # A producer that does not declare the type (another service, `replayq enqueue`)
    # cannot check it; the worker that declares it does.
    producer = app_factory()
    bad = {
        **charge_payload(
            amount="12.30",
            at=AT.isoformat(),
            order_id=str(ORDER),
            currency="EUR",
            lines=[{"sku": "a", "qty": 1}],
        ),
        "amount": 12.3,
    }
    job_id = producer.enqueue("charge", bad, check=False)

    Worker(app, burst=True, worker_id="w-typed", scheduler=False).run()
    job = app.get_job(job_id)

    assert job.state == JobState.DEAD
    assert job.attempt == 1, "a malformed payload is never retried"
    assert job.dead_reason == "malformed_payload"
    assert "field 'amount' expects Decimal" in (job.last_error or "")


def test_a_whole_payload_dataclass_round_trips_and_is_checked(app: replayq.App) -> None:
    given = Refund(ORDER, Decimal("-0.10"), AT, [Line("sku-1", 1)])
    job = run_inline(app, "refund", given)

    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.payload == {
        "order_id": str(ORDER),
        "amount": "-0.10",
        "at": AT.isoformat(),
        "lines": [{"sku": "sku-1", "qty": 1}],
    }
    assert decisions(trace(app, job.id))["refund"] == seen(given)
    assert not dry_run(app, job.id).diverged
    with pytest.raises(replayq.PayloadError, match=r"refund: field 'amount' expects Decimal"):
        app.enqueue("refund", {**job.payload, "amount": 0.1})
    with pytest.raises(
        replayq.PayloadError, match=r"refund: payload is missing required field 'at'"
    ):
        app.enqueue("refund", {"order_id": str(ORDER), "amount": "1"})


def test_the_contract_records_the_payload_schema_and_contract_diff_shows_its_change(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("pay", version="v1")
    def pay_v1(ctx: replayq.Context, order_id: int, amount: float) -> None: ...

    @app.job("pay", version="v2")
    def pay_v2(
        ctx: replayq.Context, order_id: int, amount: Decimal, at: datetime | None = None
    ) -> None: ...

    app.register_contracts()
    shown = cli_ok(app.url, "contract", "show", "pay", "--json").stdout
    changed = cli(app.url, "contract", "diff", "pay", "v1", "v2")

    assert json.loads(shown)["v2"]["payload_schema"] == {
        "order_id": "int",
        "amount": "decimal",
        "at?": {"optional": "datetime"},
    }
    assert changed.returncode == 1
    assert "payload_schema.amount" in changed.stdout
    assert "'float' -> 'decimal'" in changed.stdout
    assert "payload_schema.at?" in changed.stdout


def test_a_child_job_enqueued_with_typed_values_is_stored_in_json_form_and_runs(
    app: replayq.App,
) -> None:
    parent = run_inline(app, "reorder", {"order_id": ORDER, "amount": Decimal("5.00")})
    assert parent.state == JobState.SUCCEEDED, parent.last_error

    recorded = next(e for e in trace(app, parent.id) if e.name == "child.enqueued")
    assert recorded.data["payload"]["amount"] == "5.00"
    assert recorded.data["payload"]["at"] == "2026-12-01T09:00:00+01:00"
    (child,) = [j for j in app.list_jobs(job_type="charge")]
    Worker(app, burst=True, worker_id="w-child", scheduler=False).run()
    child = app.get_job(child.id)
    assert child.state == JobState.SUCCEEDED, child.last_error
    assert decisions(trace(app, child.id))["amount"] == "Decimal:Decimal('5.00')"
    assert decisions(trace(app, child.id))["currency"] == "Currency:<Currency.USD: 'USD'>"
    assert not dry_run(app, parent.id).diverged
