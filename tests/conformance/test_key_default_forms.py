"""A key template renders a defaulted field left out as the explicit value renders once
stored (docs/contracts.md, "Key templates"), on every backend: a default that JSON stores
in another form (a tuple, a list; a dict, its keys sorted) is rendered in the stored form,
so the job that leaves it out and the job that gives it have one lock and one effect.

(A tuple default rendered as ``(1, 2)`` where the stored payload of the job that gave it
reads back ``[1, 2]``: two lock resources, two charges, for one payload.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.testing import run_inline

AppFactory = Callable[..., replayq.App]
CHARGED: list[int] = []  # job ids: each time the effect really ran


def declare(app: replayq.App) -> replayq.App:
    @app.job("bundle", idempotency="bundle:{order_id}:{items}", lock="items:{items}")
    def bundle(ctx: replayq.Context, order_id: int, items=(1, 2)) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        def effect() -> dict[str, Any]:
            CHARGED.append(ctx.job.id)
            return {"charged_by": ctx.job.id}

        with ctx.step("charge"):
            result: dict[str, Any] = ctx.effect("ledger.charge", effect)
        return result

    @app.job("boxed", idempotency="boxed:{order_id}:{box}", lock="box:{box}")
    def boxed(ctx: replayq.Context, order_id: int, box: dict[str, int] = {"w": 2, "h": 1}) -> None:  # noqa: B006 - a default dict, never mutated
        return None

    return app


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    CHARGED.clear()
    return declare(app_factory())


def _locked(app: replayq.App, job_id: int) -> list[str | None]:
    return [e.resource for e in app.trace(job_id) if e.name == "lock.acquired"]


def test_a_tuple_default_left_out_is_one_lock_and_one_effect_with_the_value_given(
    app: replayq.App,
) -> None:
    first = run_inline(app, "bundle", {"order_id": 2})
    second = run_inline(app, "bundle", {"order_id": 2, "items": [1, 2]})
    third = run_inline(app, "bundle", {"order_id": 2, "items": (1, 2)})

    assert first.idempotency_key == second.idempotency_key == third.idempotency_key
    assert first.idempotency_key == "bundle:2:[1, 2]"
    assert _locked(app, first.id) == _locked(app, second.id) == _locked(app, third.id)
    assert _locked(app, first.id) == ["items:[1, 2]"]
    assert [first.id] == CHARGED, "one charge for one key"
    assert first.result == second.result == third.result == {"charged_by": first.id}


def test_a_dict_default_left_out_renders_as_the_stored_dict(app: replayq.App) -> None:
    left_out = run_inline(app, "boxed", {"order_id": 3})
    given = run_inline(app, "boxed", {"order_id": 3, "box": {"w": 2, "h": 1}})

    assert left_out.idempotency_key == given.idempotency_key == "boxed:3:{'h': 1, 'w': 2}"
    assert _locked(app, left_out.id) == _locked(app, given.id) == ["box:{'h': 1, 'w': 2}"]
