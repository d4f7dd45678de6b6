"""Key templates render the payload as the handler receives it (docs/contracts.md, "Key
templates"), on every backend.

A template (``idempotency``, ``ordering``, ``lock``) naming a field the payload leaves out
renders that field's default, so ``{"order_id": 2}`` and ``{"order_id": 2, "tenant": "a"}``
are one key when ``tenant`` defaults to ``"a"``: one effect, one ordering key, one lock
(it rendered ``None``: two keys, two charges). The same at enqueue, in the effect's default
key, the lock, and a dry-run's derivation. A field that is absent and has no fixed default
is refused at enqueue, naming the template and the field, and nothing is written. A job
stored by an older replayq with a ``None`` key keeps that key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec
import pydantic
import pytest

import replayq
from replayq.replay.engine import dry_run, dry_run_many
from replayq.testing import run_inline
from tests.context_support import count_rows, query, run_once

AppFactory = Callable[..., replayq.App]
CHARGED: list[tuple[int, str]] = []  # (job id, tenant): each time the effect really ran


@dataclasses.dataclass
class Refund:
    order_id: int
    amount: Decimal = Decimal("1.50")
    region: str = dataclasses.field(default_factory=lambda: "eu")  # made at each decode


class Invoice(pydantic.BaseModel):
    order_id: int
    currency: str = "EUR"


class Shipment(msgspec.Struct, omit_defaults=True):
    order_id: int
    carrier: str = "post"  # left out of the stored form: omit_defaults


def declare(app: replayq.App) -> replayq.App:
    @app.job(
        "charge",
        version="v2",
        idempotency="charge:{order_id}:{tenant}",
        ordering="order:{order_id}:{tenant}",
        lock="tenant:{tenant}",
        effects=["ledger.charge"],
    )
    def charge(ctx: replayq.Context, order_id: int, tenant: str = "a") -> dict[str, Any]:
        def effect() -> dict[str, Any]:
            CHARGED.append((ctx.job.id, tenant))
            return {"charged_by": ctx.job.id}

        with ctx.step("charge"):
            result: dict[str, Any] = ctx.effect("ledger.charge", effect)
        return result

    @app.job("tip", idempotency="tip:{order_id}:{amount}")
    def tip(ctx: replayq.Context, order_id: int, amount: Decimal = Decimal("2.50")) -> None:
        return None

    @app.job("refund", idempotency="refund:{order_id}:{amount}")
    def refund(ctx: replayq.Context, refund: Refund) -> None:
        return None

    @app.job("refund_by_region", idempotency="refund:{order_id}:{region}")
    def refund_by_region(ctx: replayq.Context, refund: Refund) -> None:
        return None

    @app.job("invoice", ordering="invoice:{order_id}:{currency}")
    def invoice(ctx: replayq.Context, invoice: Invoice) -> None:
        return None

    @app.job("ship", ordering="ship:{order_id}:{carrier}")
    def ship(ctx: replayq.Context, shipment: Shipment) -> None:
        return None

    return app


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    CHARGED.clear()
    return declare(app_factory())


def stored_keys(app: replayq.App, job_id: int) -> tuple[str | None, str | None]:
    job = app.get_job(job_id)
    return job.idempotency_key, job.ordering_key


def test_a_defaulted_field_left_out_is_stored_under_the_key_it_has_when_given(
    app: replayq.App,
) -> None:
    left_out = app.enqueue("charge", {"order_id": 2})
    given = app.enqueue("charge", {"order_id": 2, "tenant": "a"})

    assert stored_keys(app, left_out) == ("charge:2:a", "order:2:a")
    assert stored_keys(app, given) == stored_keys(app, left_out)
    assert app.get_job(left_out).payload == {"order_id": 2}, "the stored payload is as given"


def test_two_jobs_of_one_effective_payload_make_one_effect_under_one_lock(
    app: replayq.App,
) -> None:
    first = run_inline(app, "charge", {"order_id": 2})
    second = run_inline(app, "charge", {"order_id": 2, "tenant": "a"})

    assert [(first.id, "a")] == CHARGED, "one charge for one key"
    assert first.result == second.result == {"charged_by": first.id}
    keys = [
        e.data["key"] for job in (first, second) for e in app.trace(job.id) if e.data.get("key")
    ]
    assert set(keys) == {"charge:2:a:ledger.charge"}
    assert count_rows(app.runtime.url, "rq_idempotency") == 1
    # A released lock keeps its row (its fencing token goes on from there).
    locks = query(app.runtime.url, "SELECT resource, fencing_token FROM rq_locks")
    assert locks == [("tenant:a", 2)], "both runs took one lock, one after the other"


@pytest.mark.parametrize(
    ("job_type", "left_out", "given", "key"),
    [
        ("tip", {"order_id": 7}, {"order_id": 7, "amount": "2.50"}, "tip:7:2.50"),
        ("refund", {"order_id": 7}, {"order_id": 7, "amount": Decimal("1.50")}, "refund:7:1.50"),
        ("invoice", {"order_id": 7}, {"order_id": 7, "currency": "EUR"}, "invoice:7:EUR"),
        ("ship", {"order_id": 7}, {"order_id": 7, "carrier": "post"}, "ship:7:post"),
    ],
    ids=["keyword-decimal", "dataclass", "pydantic", "msgspec-omit-defaults"],
)
def test_each_payload_form_renders_a_left_out_field_as_its_default_in_json_form(
    app: replayq.App, job_type: str, left_out: dict[str, Any], given: dict[str, Any], key: str
) -> None:
    ids = [app.enqueue(job_type, left_out), app.enqueue(job_type, given)]

    assert [next(k for k in stored_keys(app, i) if k) for i in ids] == [key, key]


def test_a_left_out_field_without_a_fixed_default_is_refused_naming_template_and_field(
    app: replayq.App,
) -> None:
    with pytest.raises(replayq.PayloadError) as refused:
        app.enqueue("refund_by_region", {"order_id": 7})

    assert str(refused.value) == (
        "refund_by_region v1: the idempotency key 'refund:{order_id}:{region}' needs payload "
        "field 'region', which is absent and has no default"
    )
    assert app.list_jobs() == [], "nothing was written"
    given = app.enqueue("refund_by_region", {"order_id": 7, "region": "eu"})
    assert stored_keys(app, given) == ("refund:7:eu", None)


def test_a_dry_run_derives_the_key_the_worker_used(app: replayq.App) -> None:
    ids = [run_inline(app, "charge", {"order_id": n}).id for n in (3, 4)]
    CHARGED.clear()

    quick = dry_run_many(app, ids, keep=False)
    full = [dry_run(app, job_id, keep=False) for job_id in ids]

    for report in (*quick, *full):
        assert report.first_divergence is None, report.to_dict()
    assert CHARGED == [], "a dry-run answers from the recording"


def test_a_job_stored_with_a_none_key_keeps_it_for_its_effect_and_its_dry_run(
    app: replayq.App,
) -> None:
    # A row as replayq stored it before defaults were filled in: the key says ``None``.
    job_id = app.enqueue("charge", {"order_id": 5})
    legacy = ("charge:5:None", "order:5:None", job_id)
    query(
        app.runtime.url,
        "UPDATE rq_jobs SET idempotency_key = ?, ordering_key = ? WHERE id = ?",
        legacy,
    )
    app.register_contracts()
    run_once(replayq.Worker(app, worker_id="legacy"))

    keys = {e.data["key"] for e in app.trace(job_id) if e.data.get("key")}
    assert keys == {"charge:5:None:ledger.charge"}, "its earlier attempts' key, not a new one"
    assert stored_keys(app, job_id) == ("charge:5:None", "order:5:None"), "rows are not rewritten"
    assert dry_run(app, job_id, keep=False).first_divergence is None
    # A new job of the same payload takes the filled-in key: a separate effect.
    run_inline(app, "charge", {"order_id": 5})
    assert [tenant for _, tenant in CHARGED] == ["a", "a"]
