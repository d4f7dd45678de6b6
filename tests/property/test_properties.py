"""Properties over generated inputs (Hypothesis): payload encoding, durations, contracts,
the retry policy, and redaction.

The example counts come from the profile in ``conftest.py`` (``ci`` by default).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import replayq
from replayq import codec
from replayq.durations import parse_duration
from replayq.errors import ConfigurationError, ContractError, PayloadError
from replayq.queue.contracts import Retry, build_contract
from replayq.redaction import Redactor

NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
# Text as users send it: any code point but lone surrogates (NUL, emoji, RTL marks included).
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
big_ints = st.integers(min_value=-(2**70), max_value=2**70)
scalars = (
    st.none() | st.booleans() | big_ints | st.floats(allow_nan=False, allow_infinity=False) | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=25,
)
payloads = st.dictionaries(
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True), json_values, max_size=5
)


@given(json_values)
def test_encoding_round_trips_and_is_canonical(value: Any) -> None:
    text = codec.dumps(value)
    assert codec.loads(text) == value
    assert codec.dumps(codec.loads(text)) == text, "one canonical form"
    assert codec.fingerprint(codec.loads(text)) == codec.fingerprint_text(text)


@given(st.integers(min_value=0, max_value=codec.MAX_DEPTH + 40), st.sampled_from(["list", "dict"]))
def test_nesting_up_to_the_limit_round_trips_and_deeper_is_refused(depth: int, kind: str) -> None:
    value: Any = "leaf\x00"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    if depth <= codec.MAX_DEPTH + 1:
        assert codec.loads(codec.dumps(value)) == value
    else:
        with pytest.raises(PayloadError, match="nested more than"):
            codec.dumps(value)


@given(texts, st.integers(min_value=0xD800, max_value=0xDFFF), texts)
def test_a_lone_surrogate_anywhere_is_refused_by_name(before: str, code: int, after: str) -> None:
    with pytest.raises(PayloadError, match="lone surrogate"):
        codec.dumps({"note": [before + chr(code) + after]}, what="payload")


@given(NON_FINITE)
def test_nan_and_infinity_are_refused(number: float) -> None:
    with pytest.raises(PayloadError, match="not valid JSON"):
        codec.dumps({"x": number})


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads)
def test_payloads_come_back_from_the_database_as_they_went_in(
    app_factory: Callable[..., replayq.App], payload: dict[str, Any]
) -> None:
    # One app (and database) per backend, shared by the examples: each enqueue stands alone.
    app = app_factory.__dict__.setdefault("app", None) or _echo_app(app_factory)
    assume(app.runtime.redactor.value(payload) is payload)  # a secret is not kept as it was
    job_id = app.enqueue("echo", payload)
    assert app.get_job(job_id).payload == payload


def _echo_app(app_factory: Callable[..., replayq.App]) -> replayq.App:
    app = app_factory()

    @app.job("echo")
    def echo(ctx: replayq.Context, **payload: Any) -> None: ...

    app_factory.__dict__["app"] = app
    return app


UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", *UNITS]),
    st.sampled_from(["", " ", "  "]),
)
def test_durations_parse_to_seconds(number: int, unit: str, space: str) -> None:
    seconds = parse_duration(f"{space}{number}{space if unit else ''}{unit}{space}")
    assert seconds == pytest.approx(number * UNITS[unit or "s"])
    assert parse_duration(number) == float(number)


@given(st.text(max_size=12))
def test_anything_else_is_refused_with_the_settings_name(text: str) -> None:
    try:
        seconds = parse_duration(text, name="lease")
    except ConfigurationError as exc:
        assert str(exc).startswith("lease: ")
    else:
        assert math.isfinite(seconds) and seconds >= 0


@given(NON_FINITE)
def test_a_duration_is_a_finite_number_of_seconds(number: float) -> None:
    with pytest.raises(ConfigurationError, match="finite"):
        parse_duration(number, name="lease")


positive = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


@given(positive, st.one_of(st.none(), st.floats(min_value=0, max_value=2e6)), st.booleans())
def test_contract_validation_accepts_exactly_the_heartbeats_shorter_than_the_lease(
    lease: float, heartbeat: float | None, locked: bool
) -> None:
    fields = ("order_id",)
    lock = "order:{order_id}" if locked else None
    ok = heartbeat is None or heartbeat == 0 or 0 < heartbeat < lease
    if ok:
        contract = build_contract("t", fields=fields, lease=lease, heartbeat=heartbeat, lock=lock)
        assert contract.lease == lease
        assert contract.lock_ttl is None or contract.lock_ttl >= contract.lease
    else:
        with pytest.raises(ContractError, match="heartbeat"):
            build_contract("t", fields=fields, lease=lease, heartbeat=heartbeat, lock=lock)


@given(positive, positive)
def test_a_lock_ttl_shorter_than_the_lease_is_refused(lease: float, ttl: float) -> None:
    kwargs: dict[str, Any] = {"fields": ("k",), "lease": lease, "lock": "r:{k}", "lock_ttl": ttl}
    if ttl < lease:
        with pytest.raises(ContractError, match="lock_ttl"):
            build_contract("t", **kwargs)
    else:
        assert build_contract("t", **kwargs).lock_ttl == ttl


@given(
    st.floats(min_value=0.001, max_value=1e4),
    st.floats(min_value=1.0, max_value=1e3),
    st.integers(min_value=1, max_value=100_000),
    st.sampled_from(["full", "none"]),
    st.integers(min_value=0, max_value=2**32),
)
def test_retry_delays_stay_within_zero_and_the_capped_ceiling(
    base: float, factor: float, attempt: int, jitter: str, seed: int
) -> None:
    policy = Retry(base=base, cap=base * factor, jitter=jitter)  # type: ignore[arg-type]
    ceiling = policy.ceiling(attempt)
    assert base <= ceiling <= policy.cap_seconds or ceiling == pytest.approx(policy.cap_seconds)
    assert policy.ceiling(attempt + 1) >= ceiling
    delay = policy.delay(attempt, random.Random(seed))
    assert 0 <= delay <= ceiling
    if jitter == "none":
        assert delay == ceiling


@given(
    st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True)
)
def test_a_retry_policy_is_valid_or_refused(base: float, cap: float) -> None:
    try:
        policy = Retry(base=base, cap=cap)
    except (ContractError, ConfigurationError):
        return
    assert 0 < policy.base_seconds <= policy.cap_seconds
    assert math.isfinite(policy.ceiling(10**6))


@given(payloads)
def test_redaction_is_idempotent_and_keeps_everything_that_is_not_secret(
    payload: dict[str, Any],
) -> None:
    redactor = Redactor.build(key=b"k")
    once = redactor.value(payload)
    assert redactor.value(once) == once
    assert codec.loads(codec.dumps(once)) == once
    assert set(once) == set(payload)
    for name, value in payload.items():
        if not redactor.secret_field(name) and _untouchable(value):
            assert once[name] == value


def _untouchable(value: Any) -> bool:
    """No text and no object in it: nothing redaction could find."""
    if isinstance(value, list):
        return all(_untouchable(v) for v in value)
    return not isinstance(value, str | dict)
