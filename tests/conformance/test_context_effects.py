"""Effects behind idempotency records: one real effect per business key, outcomes recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from msgspec import structs

import replayq
from replayq.storage.protocol import IdemClaim, idem_get
from tests.context_support import named, query, run_once

AppFactory = Callable[..., replayq.App]
RETRY = replayq.Retry(max_attempts=3, base="1s", cap="1s")


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    return app_factory(clock=clock)


def idempotency_record(app: replayq.App, key: str) -> dict[str, Any]:
    with app.storage.transaction(readonly=True) as tx:
        row = idem_get(tx, key)
    assert row is not None, f"no idempotency record for {key!r}"
    return structs.asdict(row)


def test_effect_runs_once_per_key_and_a_second_job_gets_the_stored_result(
    app: replayq.App,
) -> None:
    sent: list[int] = []

    def send(order_id: int) -> dict[str, Any]:
        sent.append(order_id)
        return {"message_id": f"msg-{len(sent)}"}

    @app.job("confirm", idempotency="confirm:{order_id}")
    def confirm(ctx: replayq.Context, order_id: int, reason: str) -> dict[str, Any]:
        with ctx.step("email"):
            result: dict[str, Any] = ctx.effect("email.send", lambda: send(order_id))
        return result

    first = app.enqueue("confirm", {"order_id": 7, "reason": "placed"})
    second = app.enqueue("confirm", {"order_id": 7, "reason": "resent by a duplicate event"})
    worker = replayq.Worker(app)
    run_once(worker)
    run_once(worker)

    assert sent == [7], "the email went out once"
    assert app.get_job(first).result == {"message_id": "msg-1"}
    assert app.get_job(second).result == {"message_id": "msg-1"}, "the stored result"
    record = idempotency_record(app, "confirm:7:email.send")
    assert record["status"] == "succeeded"
    assert record["operation"] == "email.send"
    assert record["job_id"] == first
    assert record["trace_id"] == app.get_job(first).trace_id
    assert record["completed_at"] is not None and record["started_at"] is not None
    [done] = named(app, first, "effect.succeeded")
    assert done.side_effect and done.data["result"] == {"message_id": "msg-1"}
    assert named(app, second, "effect.succeeded") == []
    [dedup] = named(app, second, "effect.deduplicated")
    assert dedup.resource == "confirm:7:email.send"
    assert dedup.data["first_job"] == first
    assert dedup.data["first_trace"] == app.get_job(first).trace_id
    assert dedup.data["result"] == {"message_id": "msg-1"}
    assert not dedup.side_effect, "no side effect happened in the second job"


def test_an_explicit_key_overrides_the_contract_template(app: replayq.App) -> None:
    charged: list[str] = []

    @app.job("charge", idempotency="charge:{order_id}")
    def charge(ctx: replayq.Context, order_id: int, attempt_label: str) -> None:
        with ctx.step("charge"):
            ctx.effect("card.charge", lambda: charged.append(attempt_label), key="pay:order-1")

    worker = replayq.Worker(app)
    app.enqueue("charge", {"order_id": 1, "attempt_label": "a"})
    app.enqueue("charge", {"order_id": 2, "attempt_label": "b"})
    run_once(worker)
    run_once(worker)
    assert charged == ["a"], "one business key, one charge"
    assert idempotency_record(app, "pay:order-1")["status"] == "succeeded"


def test_an_effect_without_any_key_is_refused(app: replayq.App) -> None:
    ran: list[int] = []

    @app.job("nokey")
    def nokey(ctx: replayq.Context) -> None:
        ctx.effect("email.send", lambda: ran.append(1))

    job_id = app.enqueue("nokey", {})
    run_once(replayq.Worker(app))
    assert ran == [], "never run without a business key (keys are never random)"
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert "needs an idempotency key" in job.last_error


def test_effect_that_raises_is_recorded_failed_retried_by_class_then_succeeds(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    calls: list[int] = []

    def flaky_gateway() -> dict[str, str]:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("gateway did not answer in 5s")
        return {"charge": "ch_1"}

    @app.job("pay", idempotency="pay:{order_id}", retry=RETRY)
    def pay(ctx: replayq.Context, order_id: int) -> dict[str, str]:
        with ctx.step("charge"):
            result: dict[str, str] = ctx.effect("card.charge", flaky_gateway)
        return result

    job_id = app.enqueue("pay", {"order_id": 3})
    worker = replayq.Worker(app)
    run_once(worker)

    record = idempotency_record(app, "pay:3:card.charge")
    assert record["status"] == "failed"
    assert "TimeoutError: gateway did not answer" in record["error"]
    [failed] = named(app, job_id, "effect.failed")
    assert failed.status == "fail" and "TimeoutError" in failed.data["error"]
    job = app.get_job(job_id)
    assert (job.state, job.last_error_class) == (replayq.JobState.QUEUED, "transient")
    [retry] = named(app, job_id, "retry.scheduled")
    assert retry.data["reason"] == "transient"

    clock.advance(2)
    run_once(worker)
    assert calls == [1, 1], "a failed effect may be tried again"
    assert app.get_job(job_id).result == {"charge": "ch_1"}
    assert idempotency_record(app, "pay:3:card.charge")["status"] == "succeeded"


def test_effect_that_raises_a_validation_error_goes_dead_without_retrying(
    app: replayq.App,
) -> None:
    calls: list[int] = []

    def reject() -> None:
        calls.append(1)
        raise replayq.ValidationError("card number is invalid")

    @app.job("pay", idempotency="pay:{order_id}", retry=RETRY)
    def pay(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("charge"):
            ctx.effect("card.charge", reject)

    job_id = app.enqueue("pay", {"order_id": 4})
    run_once(replayq.Worker(app))

    assert calls == [1]
    assert idempotency_record(app, "pay:4:card.charge")["status"] == "failed"
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert (job.last_error_class, job.dead_reason) == ("validation", "not_retryable")
    assert named(app, job_id, "retry.scheduled") == []


def claimed_by_a_crashed_attempt(app: replayq.App) -> None:
    """``notify:8:email.send`` left ``started`` by an attempt that crashed mid-effect."""
    with app.storage.transaction() as tx:
        assert tx.idem_transition(
            IdemClaim(
                key="notify:8:email.send",
                operation="email.send",
                claim_token="claim-of-the-crashed-attempt",
                now=app.clock.now(),
                trace_id="trace-of-the-crashed-attempt",
                job_id=None,
                attempt=1,
            )
        )


@pytest.mark.parametrize("policy", ["park", "retry"])
def test_a_started_record_left_by_a_crashed_attempt_follows_the_kinds_policy(
    app: replayq.App, policy: str
) -> None:
    """The crashed attempt is simulated by its claim; acceptance tests crash a real process."""
    sent: list[int] = []

    @app.job("notify", idempotency="notify:{user_id}", effects={"email.send": policy})
    def notify(ctx: replayq.Context, user_id: int) -> str:
        with ctx.step("email"):
            ctx.effect("email.send", lambda: sent.append(user_id))
        return "sent"

    claimed_by_a_crashed_attempt(app)
    job_id = app.enqueue("notify", {"user_id": 8})
    run_once(replayq.Worker(app))

    [in_doubt] = named(app, job_id, "effect.in_doubt")
    assert in_doubt.data["policy"] == policy
    job = app.get_job(job_id)
    record = idempotency_record(app, "notify:8:email.send")
    if policy == "park":
        assert sent == [], "a human checks the real world first"
        assert job.state is replayq.JobState.DEAD
        assert job.dead_reason == "effect_in_doubt"
        assert record["status"] == "started"
    else:
        assert sent == [8]
        assert job.state is replayq.JobState.SUCCEEDED
        assert (record["status"], record["job_id"]) == ("succeeded", job_id)


@pytest.mark.parametrize("found", ["succeeded", "park", "retry"])
def test_an_effects_existing_record_is_traced_in_order_with_no_sequence_number_skipped(
    app: replayq.App, found: str
) -> None:
    """The claim finds a record (another job's success, a crashed attempt's claim): the
    attempt's events say so in the order they happened, numbered one after another, on
    each backend alike. On PostgreSQL the claim's first, one-round-trip try is refused in
    the server (the record exists) and the claim is made again the careful way: the
    ``effect.claimed`` the refused try built is made again after ``effect.in_doubt``
    (``retry``), or never (``park``, a deduplicated effect), and leaves no gap."""
    sent: list[int] = []
    policy = "retry" if found == "retry" else "park"

    @app.job("notify", idempotency="notify:{user_id}", effects={"email.send": policy})
    def notify(ctx: replayq.Context, user_id: int) -> str:
        with ctx.step("email"):
            ctx.effect("email.send", lambda: sent.append(user_id))
        return "sent"

    if found == "succeeded":
        first = app.enqueue("notify", {"user_id": 8})
        run_once(replayq.Worker(app))
        assert app.get_job(first).state is replayq.JobState.SUCCEEDED
    else:
        claimed_by_a_crashed_attempt(app)
    job_id = app.enqueue("notify", {"user_id": 8})
    run_once(replayq.Worker(app))

    events = [e for e in app.trace(job_id) if e.kind == "domain"]
    expected = {
        "succeeded": ["step.started", "effect.deduplicated", "step.finished"],
        "park": ["step.started", "effect.in_doubt", "step.finished"],
        "retry": [
            "step.started",
            "effect.in_doubt",
            "effect.claimed",
            "effect.succeeded",
            "step.finished",
        ],
    }[found]
    assert [e.name for e in events] == expected
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), events
    assert sent == ([] if found == "park" else [8]), "the effect ran once, or never (parked)"


def test_effect_records_are_per_key_not_per_job(app: replayq.App) -> None:
    @app.job("two_emails", idempotency="welcome:{user_id}")
    def two_emails(ctx: replayq.Context, user_id: int) -> None:
        with ctx.step("emails"):
            ctx.effect("email.welcome", lambda: "w")
            ctx.effect("email.tips", lambda: "t")

    job_id = app.enqueue("two_emails", {"user_id": 2})
    run_once(replayq.Worker(app))
    rows = query(
        app.url, "SELECT key, status FROM rq_idempotency WHERE job_id = ? ORDER BY key", (job_id,)
    )
    assert rows == [("welcome:2:email.tips", "succeeded"), ("welcome:2:email.welcome", "succeeded")]


def test_an_effect_result_is_recorded_redacted_as_any_event_data(app: replayq.App) -> None:
    # The ``effect.succeeded`` event takes the result as ``encoded`` redacted it (not
    # screened a second time): a secret inside it, and a field the job's rules call
    # secret (here ``result`` itself), never reach the trace in clear.
    @app.job("inner", idempotency="inner:{n}")
    def inner(ctx: replayq.Context, n: int) -> None:
        with ctx.step("pay"):
            ctx.effect("pay", lambda: {"charge_id": "ch_1", "password": "hunter2-secret"})

    @app.job("whole", idempotency="whole:{n}", redact=replayq.Redaction(["result"]))
    def whole(ctx: replayq.Context, n: int) -> None:
        with ctx.step("pay"):
            ctx.effect("pay", lambda: {"charge_id": "ch_2", "note": "visible-elsewhere"})

    first = app.enqueue("inner", {"n": 1})
    second = app.enqueue("whole", {"n": 2})
    worker = replayq.Worker(app)
    run_once(worker)
    run_once(worker)

    (inner_event,) = [e for e in app.trace(first) if e.name == "effect.succeeded"]
    assert inner_event.data["result"]["charge_id"] == "ch_1"
    assert inner_event.data["result"]["password"].startswith("[redacted")
    assert "hunter2-secret" not in str(inner_event.data)
    (whole_event,) = [e for e in app.trace(second) if e.name == "effect.succeeded"]
    assert isinstance(whole_event.data["result"], str)
    assert whole_event.data["result"].startswith("[redacted")
    assert whole_event.data["kind"] == "pay", "the other fields as any event's"
