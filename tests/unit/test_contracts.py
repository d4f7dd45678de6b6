"""Job contracts: validated when declared, frozen as data, diffed and linted."""

from __future__ import annotations

from typing import Any

import pytest

import replayq
from replayq.queue.contracts import (
    JobContract,
    LockHold,
    build_contract,
    diff_contracts,
    lint_contract,
    render_template,
    unchecked_rules,
)

FIELDS = ("order_id", "customer")


def contract(**overrides: Any) -> JobContract:
    return build_contract("ship_order", fields=FIELDS, **overrides)


def offline_app() -> replayq.App:
    """An App whose database is never opened: declaring job types needs no I/O."""
    return replayq.App("sqlite:////nonexistent/never-opened.db")


# -- validation when declared -----------------------------------------------------------------


def test_defaults_derive_heartbeat_and_lock_ttl_from_the_lease() -> None:
    made = contract(lease="30s", lock="order:{order_id}")
    assert made.lease == 30
    assert made.heartbeat == 10
    assert made.lock_ttl == 60
    assert made.ack == "after_commit"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease": "10s", "heartbeat": "10s"}, "heartbeat .* shorter than the lease"),
        ({"lease": "10s", "heartbeat": "1m"}, "heartbeat"),
        ({"lease": 0}, "lease must be positive"),
        ({"lease": "forever"}, "ship_order: lease"),
        ({"lock": "order:{order_id}", "lease": "30s", "lock_ttl": "10s"}, "lock_ttl .* shorter"),
        ({"idempotency": "ship:{order_no}"}, r"\{order_no\}, which is not a payload field"),
        ({"ordering": "order:{}"}, "named payload fields"),
        ({"lock": "order:{0}"}, "named payload fields"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"errors": {KeyError: "sometimes"}}, "unknown class 'sometimes'"),
        ({"resume": "attempt"}, "resume='attempt'; use 'step'"),
    ],
)
def test_contract_that_cannot_work_is_rejected_when_declared(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(replayq.ConfigurationError, match=message):
        contract(**overrides)


@pytest.mark.parametrize("name", ["", "ship order", "ship/order", "ship;order"])
def test_job_type_names_are_plain(name: str) -> None:
    with pytest.raises(replayq.ContractError, match="job type"):
        build_contract(name, fields=())


def test_app_job_validates_templates_against_the_handler_signature() -> None:
    app = offline_app()
    with pytest.raises(replayq.ContractError, match=r"\{order\}"):

        @app.job("ship_order", idempotency="ship:{order}")
        def ship_order(ctx: replayq.Context, order_id: int) -> None: ...


def test_same_type_and_version_cannot_be_declared_twice() -> None:
    app = offline_app()

    def handler(ctx: replayq.Context) -> None: ...

    app.job("ping")(handler)
    with pytest.raises(replayq.ContractError, match="declared twice"):
        app.job("ping")(handler)


def test_handler_must_take_ctx() -> None:
    app = offline_app()
    with pytest.raises(replayq.ContractError, match="ctx"):
        app.job("ping")(lambda: None)


def test_newest_version_is_active_unless_declared_as_candidate() -> None:
    app = offline_app()

    def handler(ctx: replayq.Context) -> None: ...

    app.job("ping", version="v1")(handler)
    app.job("ping", version="v2")(handler)
    app.job("ping", version="v3", candidate=True)(handler)
    assert app.active_version("ping") == "v2"
    assert app.handler("ping").contract.version == "v2"
    assert app.handler("ping", "v3").contract.version == "v3"
    with pytest.raises(replayq.UnknownJobTypeError, match="v9"):
        app.handler("ping", "v9")


def test_key_templates_render_from_the_payload() -> None:
    assert render_template("order:{order_id}", {"order_id": 12, "x": 1}) == "order:12"
    assert render_template(None, {"order_id": 12}) is None


def test_contract_survives_its_stored_form() -> None:
    made = contract(
        lease="45s",
        retry=replayq.Retry(max_attempts=3, base="2s", cap="1m", on=("dependency",)),
        idempotency="ship:{order_id}",
        ordering="customer:{customer}",
        lock="order:{order_id}",
        effects=("warehouse.create_shipment",),
        errors={TimeoutError: "dependency"},
    )
    stored = made.to_dict()
    assert JobContract.from_dict(stored).to_dict() == stored
    assert diff_contracts(JobContract.from_dict(stored), made) == []


def test_retries_resume_at_the_failed_step_unless_the_contract_says_none() -> None:
    assert contract().resume == "step"
    assert contract(resume="none").to_dict()["resume"] == "none"


def test_a_contract_stored_before_resume_existed_reads_as_the_default() -> None:
    stored = contract().to_dict()
    del stored["resume"]
    assert JobContract.from_dict(stored) == contract()


def test_diff_flags_a_change_of_retry_resumption() -> None:
    [change] = diff_contracts(contract(), contract(version="v2", resume="none"))
    assert (change.field, change.old, change.new) == ("resume", "step", "none")
    assert change.concern == "retry resumption"


# -- diff -------------------------------------------------------------------------------------


def test_identical_contracts_have_no_diff() -> None:
    assert diff_contracts(contract(), contract(version="v2")) == []


def test_diff_names_every_operational_change_with_its_concern() -> None:
    old = contract(lease="30s", retry=replayq.Retry(max_attempts=5))
    new = contract(
        version="v2",
        lease="60s",
        heartbeat="10s",
        retry=replayq.Retry(max_attempts=3, jitter="none", on=("transient",)),
        idempotency="ship:{order_id}",
        ordering="customer:{customer}",
        lock="order:{order_id}",
        lock_ttl="2m",
        max_payload_bytes=1024,
    )
    changes = {change.field: change for change in diff_contracts(old, new)}
    assert set(changes) == {
        "lease",
        "retry.max_attempts",
        "retry.jitter",
        "retry.on",
        "idempotency",
        "ordering",
        "lock",
        "lock_ttl",
        "max_payload_bytes",
    }
    assert (changes["lease"].old, changes["lease"].new) == (30.0, 60.0)
    assert changes["lease"].concern == "lease / visibility timeout"
    assert changes["retry.on"].concern == "retry policy"
    assert changes["lock_ttl"].concern == "locking"
    assert changes["retry.on"].new == ["transient"]


# -- lint -------------------------------------------------------------------------------------


def rules(made: JobContract, p99: float | None = None) -> set[str]:
    return {finding.rule for finding in lint_contract(made, p99_duration=p99)}


def test_sound_contract_has_no_findings() -> None:
    made = contract(idempotency="ship:{order_id}", effects=("email",))
    assert rules(made, p99=1.0) == set()


def test_lint_flags_lease_shorter_than_observed_p99() -> None:
    assert rules(contract(lease="5s"), p99=7.5) == {"lease-below-p99"}
    assert rules(contract(lease="5s"), p99=4.0) == set()


def test_lint_flags_effects_without_an_idempotency_key() -> None:
    assert rules(contract(effects=("email.send",))) == {"effects-without-idempotency-key"}


def test_lint_flags_retries_without_jitter_and_retried_validation() -> None:
    made = contract(retry=replayq.Retry(jitter="none", on=("transient", "validation", "unknown")))
    assert rules(made) == {"retry-without-jitter", "validation-retried", "unknown-retried"}


def test_lint_flags_a_stored_lock_ttl_shorter_than_the_lease() -> None:
    # Declaring this is refused; a contract stored by older code can still carry it.
    legacy = JobContract("ship_order", lease=30, lock="order:{order_id}", lock_ttl=10)
    assert rules(legacy) == {"lock-ttl-below-lease"}


def test_lint_of_a_contract_lock_with_runs_but_no_recorded_hold_is_unchecked() -> None:
    locked = JobContract("ship_order", lease=30, lock="order:{order_id}", lock_ttl=60)
    assert [u.rule for u in unchecked_rules(locked, attempts=3)] == ["lock-held-past-ttl"]
    held = [LockHold("order:1", 60, 1.0)]
    assert unchecked_rules(locked, attempts=3, lock_holds=held, attempts_read=3) == []
    assert unchecked_rules(contract(), attempts=3, attempts_read=3) == [], "no lock: checked"
    assert {u.kind for u in unchecked_rules(contract(), attempts=0)} == {"unchecked"}
