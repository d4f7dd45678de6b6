"""Retries resume at the failed step: a step an earlier attempt committed is not run again.

The handler is four ``ctx.step(name, fn)`` steps that each write state and
publish an outbox event; the fourth fails once with a transient error. The
counters are the proof of what really ran; the outbox and state tables are read
straight from the database.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from msgspec import structs

import replayq
from replayq.replay.engine import dry_run
from replayq.replay.recorded import Outcome
from replayq.storage.protocol import OutboxInsert, StepComplete, TraceQuery
from tests.context_support import count_rows, named, query, run_once

AppFactory = Callable[..., replayq.App]


def declare_fulfil(app: replayq.App, *, resume: str) -> Counter[str]:
    """The four-step handler; returns the counter of step bodies that ran."""
    ran: Counter[str] = Counter()

    @app.job(
        "fulfil",
        retry=replayq.Retry(max_attempts=3, base="1s", jitter="none"),
        resume=resume,
    )
    def fulfil(ctx: replayq.Context, order_id: int, sku: str) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            ran["load"] += 1
            order = ctx.state.get("order", order_id)
            ctx.outbox.publish("order.loaded", {"order_id": order_id})
            return {"amount": order.data["amount"]}

        def reserve() -> str:
            ran["reserve"] += 1
            stock = ctx.state.get("stock", sku)
            ctx.state.put("stock", sku, {"on_hand": stock.data["on_hand"] - 1})
            ctx.outbox.publish("stock.reserved", {"sku": sku})
            return str(ctx.uuid())

        def charge(amount: int) -> str:
            ran["charge"] += 1
            order = ctx.state.get("order", order_id)
            ctx.state.put("order", order_id, {**order.data, "status": "charged"})
            ctx.outbox.publish("order.charged", {"order_id": order_id, "amount": amount})
            return f"ch-{order_id}-{ctx.attempt}"

        def confirm(reservation: str, charge_id: str) -> str:
            ran["confirm"] += 1
            order = ctx.state.get("order", order_id)
            if ctx.attempt == 1:
                raise replayq.TransientError("confirmation service timed out")
            assert order.data["status"] == "charged", "a skipped step's write is visible"
            ctx.state.put("order", order_id, {**order.data, "status": "confirmed"})
            ctx.outbox.publish("order.confirmed", {"order_id": order_id})
            return f"{reservation}/{charge_id}"

        loaded = ctx.step("load", load)
        reservation = ctx.step("reserve", reserve)
        charge_id = ctx.step("charge", charge, loaded["amount"])
        confirmation = ctx.step("confirm", confirm, reservation, charge_id)
        return {"confirmation": confirmation}

    return ran


def run_to_the_end(app: replayq.App, clock: replayq.FrozenClock) -> replayq.Job:
    app.state.put("order", 7, {"amount": 40, "status": "new"}, expected_version=0)
    app.state.put("stock", "sku-1", {"on_hand": 10}, expected_version=0)
    job_id = app.enqueue("fulfil", {"order_id": 7, "sku": "sku-1"})
    worker = replayq.Worker(app)
    app.register_contracts()
    run_once(worker)
    assert app.get_job(job_id).state is replayq.JobState.QUEUED, "attempt 1 is retried"
    clock.advance(2)
    run_once(worker)
    return app.get_job(job_id)


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


def outbox_rows(app: replayq.App, job_id: int) -> list[tuple[Any, ...]]:
    return query(
        app.url, "SELECT event_id, topic FROM rq_outbox WHERE job_id = ? ORDER BY id", (job_id,)
    )


def test_a_retry_skips_the_steps_an_earlier_attempt_committed(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    ran = declare_fulfil(app, resume="step")

    job = run_to_the_end(app, clock)

    assert job.state is replayq.JobState.SUCCEEDED
    assert job.attempt == 2
    assert ran == {"load": 1, "reserve": 1, "charge": 1, "confirm": 2}
    # The skipped steps' results reached the failed step: the reservation id drawn in
    # attempt 1 (ctx.uuid) and the charge id made in attempt 1.
    assert job.result["confirmation"].endswith("/ch-7-1")
    skipped = named(app, job.id, "step.skipped")
    assert [(e.attempt, e.data["step_name"], e.status) for e in skipped] == [
        (2, "load", "skipped"),
        (2, "reserve", "skipped"),
        (2, "charge", "skipped"),
    ]
    assert {e.data["reason"] for e in skipped} == {"completed in attempt 1"}
    assert [e.data["step_name"] for e in named(app, job.id, "step.started") if e.attempt == 2] == [
        "confirm"
    ]
    # One event per step position in the outbox, and each step's state written once.
    rows = outbox_rows(app, job.id)
    assert [topic for _, topic in rows] == [
        "order.loaded",
        "stock.reserved",
        "order.charged",
        "order.confirmed",
    ]
    assert len({event_id for event_id, _ in rows}) == 4
    assert [v.attempt for v in app.state.history("stock", "sku-1")] == [None, 1]
    assert app.state.get("stock", "sku-1").data == {"on_hand": 9}
    assert [v.data["status"] for v in app.state.history("order", 7)] == [
        "new",
        "charged",
        "confirmed",
    ]
    assert count_rows(app.url, "rq_steps", "job_id = ?", (job.id,)) == 4


def test_with_resume_none_every_attempt_runs_every_step_and_the_outbox_still_dedups(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    ran = declare_fulfil(app, resume="none")

    job = run_to_the_end(app, clock)

    assert job.state is replayq.JobState.SUCCEEDED
    assert ran == {"load": 2, "reserve": 2, "charge": 2, "confirm": 2}
    assert named(app, job.id, "step.skipped") == []
    assert job.result["confirmation"].endswith("/ch-7-2")
    # The old behaviour for state: the re-run step reserved stock again ...
    assert app.state.get("stock", "sku-1").data == {"on_hand": 8}
    # ... but its outbox rows carry the same event ids as attempt 1's and are not duplicated.
    rows = outbox_rows(app, job.id)
    assert [topic for _, topic in rows] == [
        "order.loaded",
        "stock.reserved",
        "order.charged",
        "order.confirmed",
    ]
    written = named(app, job.id, "outbox.written")
    first = [e.data["event_id"] for e in written if e.attempt == 1]
    again = [e for e in written if e.attempt == 2]
    assert [e.data["event_id"] for e in again][:3] == first
    assert [bool(e.data.get("deduplicated")) for e in again] == [True, True, True, False]
    assert count_rows(app.url, "rq_steps", "job_id = ?", (job.id,)) == 0


def test_a_dry_run_of_the_resumed_attempt_replays_the_skips_without_divergence(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    ran = declare_fulfil(app, resume="step")
    job = run_to_the_end(app, clock)
    before = dict(ran)

    resumed = dry_run(app, job.id, attempt=2)
    first = dry_run(app, job.id, attempt=1)

    assert not resumed.diverged, resumed.to_dict()
    assert resumed.outcome_now == Outcome("succeeded", result=job.result)
    assert first.outcome_now.status == "failed"
    assert first.outcome_recorded.status == "failed"
    assert first.first_divergence is None, first.to_dict()
    # The replay of attempt 2 skipped what attempt 2 skipped; attempt 1's replay ran its
    # steps again (answers from the recording), and the confirm step of both.
    assert ran - Counter(before) == {"load": 1, "reserve": 1, "charge": 1, "confirm": 2}
    with app.storage.transaction(readonly=True) as tx:
        replayed = tx.trace_query(TraceQuery(trace_id=resumed.trace_id))
    assert [e.data["step_name"] for e in replayed if e.name == "step.skipped"] == [
        "load",
        "reserve",
        "charge",
    ]
    assert count_rows(app.url, "rq_outbox") == 4, "a dry-run publishes nothing"


def test_a_with_block_cannot_be_skipped_and_runs_on_every_attempt(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    ran: Counter[str] = Counter()

    @app.job("mixed", retry=replayq.Retry(max_attempts=2, base="1s", jitter="none"))
    def mixed(ctx: replayq.Context) -> None:
        with ctx.step("block"):
            ran["block"] += 1
            ctx.outbox.publish("block.done", {})
        ctx.step("callable", lambda: ran.update(["callable"]))
        if ctx.attempt == 1:
            raise replayq.TransientError("later")

    job_id = app.enqueue("mixed", {})
    worker = replayq.Worker(app)
    run_once(worker)
    clock.advance(2)
    run_once(worker)

    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert ran == {"block": 2, "callable": 1}
    assert [e.data["step_name"] for e in named(app, job_id, "step.skipped")] == ["callable"]
    assert count_rows(app.url, "rq_outbox", "job_id = ?", (job_id,)) == 1


def test_same_named_steps_resume_at_the_iteration_that_failed(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    ran: list[int] = []

    @app.job("batch", retry=replayq.Retry(max_attempts=2, base="1s", jitter="none"))
    def batch(ctx: replayq.Context) -> list[int]:
        def item(n: int) -> int:
            ran.append(n)
            if n == 2 and ctx.attempt == 1:
                raise replayq.TransientError("item 2 failed")
            ctx.outbox.publish("item.done", {"n": n})
            return n * 10

        return [ctx.step("item", item, n) for n in range(4)]

    job_id = app.enqueue("batch", {})
    worker = replayq.Worker(app)
    run_once(worker)
    clock.advance(2)
    run_once(worker)

    job = app.get_job(job_id)
    assert job.result == [0, 10, 20, 30]
    assert ran == [0, 1, 2, 2, 3]
    skipped = named(app, job_id, "step.skipped")
    assert [e.data["step_key"] for e in skipped] == ["item", "item#2"]
    assert count_rows(app.url, "rq_outbox", "job_id = ?", (job_id,)) == 4


def test_a_step_fn_that_returns_an_awaitable_is_refused(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)

    async def fetch() -> int:
        return 1

    @app.job("wrong", retry=replayq.Retry(max_attempts=1))
    def wrong(ctx: replayq.Context) -> None:
        ctx.step("fetch", fetch)

    job_id = app.enqueue("wrong", {})
    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert "returned an awaitable" in (job.last_error or "")


def test_a_contract_stored_before_resume_existed_still_registers(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    declare_fulfil(app, resume="step")
    app.register_contracts()
    [(body,)] = query(app.url, "SELECT body FROM rq_contracts WHERE job_type = 'fulfil'")
    older = json.loads(body)
    del older["resume"]
    query(
        app.url, "UPDATE rq_contracts SET body = ? WHERE job_type = 'fulfil'", (json.dumps(older),)
    )

    app.register_contracts()  # an upgrade of replayq is not a change of the contract

    [stored] = app.contracts("fulfil")
    assert stored.resume == "step"


def test_the_step_ledger_and_the_outbox_keep_the_first_write_of_a_position(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    step = StepComplete(
        job_id=1,
        step_key="load",
        step_name="load",
        attempt=1,
        trace_id="t-1",
        result='{"n": 1}',
        result_ref=None,
        now=1.0,
    )
    row = OutboxInsert(
        event_id="t-1:step:load:0", topic="t", payload="{}", job_id=1, trace_id="t-1", now=1.0
    )
    with app.storage.transaction() as tx:
        assert tx.step_complete(step)
        assert not tx.step_complete(structs.replace(step, attempt=2, result='{"n": 2}'))
        assert tx.outbox_update(row)
        assert not tx.outbox_update(structs.replace(row, payload='{"again": true}'))
    with app.storage.transaction(readonly=True) as tx:
        [ledger] = tx.step_by_job(1)
        [outbox] = tx.outbox_by_job(1)
    assert (ledger.attempt, ledger.result) == (1, '{"n": 1}')
    assert outbox.payload == "{}"
