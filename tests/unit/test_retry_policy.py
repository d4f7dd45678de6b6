"""Retry policy and failure classification: which failures retry, and after how long."""

from __future__ import annotations

import random

import pytest

import replayq
from replayq.errors import DEFAULT_ERROR_MAP, FailureClass, classify


def test_backoff_ceiling_doubles_from_base_up_to_the_cap() -> None:
    policy = replayq.Retry(base="1s", cap="10s")
    assert [policy.ceiling(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_full_jitter_delays_stay_within_the_ceiling_and_follow_the_rng() -> None:
    policy = replayq.Retry(base="0.5s", cap="1m", jitter="full")
    rng, replay = random.Random(42), random.Random(42)
    for attempt in range(1, 12):
        delay = policy.delay(attempt, rng)
        assert 0 <= delay <= policy.ceiling(attempt)
        assert delay == replay.uniform(0, policy.ceiling(attempt))


def test_full_jitter_spreads_retries_of_many_jobs() -> None:
    policy = replayq.Retry(base="1s", cap="1m")
    rng = random.Random(1)
    delays = [policy.delay(3, rng) for _ in range(200)]
    assert min(delays) < 1 and max(delays) > 3, "spread over [0, 4s], not bunched"


def test_no_jitter_waits_exactly_the_ceiling() -> None:
    policy = replayq.Retry(base="1s", cap="5s", jitter="none")
    assert [policy.delay(n, random.Random()) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]


def test_validation_is_never_retried_even_when_listed() -> None:
    policy = replayq.Retry(on=("transient", "validation"))
    assert policy.retries(FailureClass.TRANSIENT)
    assert not policy.retries(FailureClass.VALIDATION)


def test_default_policy_retries_transient_dependency_concurrency_only() -> None:
    policy = replayq.Retry()
    retried = {c for c in FailureClass if policy.retries(c)}
    assert retried == {FailureClass.TRANSIENT, FailureClass.DEPENDENCY, FailureClass.CONCURRENCY}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"base": "0s"}, "base"),
        ({"base": "10s", "cap": "1s"}, "cap"),
        ({"jitter": "equal"}, "jitter"),
        ({"on": ("transient", "flaky")}, "'flaky'"),
        ({"base": "soon"}, "Retry.base"),
    ],
)
def test_impossible_retry_policy_is_rejected_when_declared(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(replayq.ConfigurationError, match=message):
        replayq.Retry(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "failure_class"),
    [
        (replayq.TransientError("x"), FailureClass.TRANSIENT),
        (replayq.DependencyError("x"), FailureClass.DEPENDENCY),
        (replayq.ConcurrencyError("x"), FailureClass.CONCURRENCY),
        (replayq.ValidationError("x"), FailureClass.VALIDATION),
        (TimeoutError(), FailureClass.TRANSIENT),
        (ConnectionResetError(), FailureClass.TRANSIENT),
        (KeyError("x"), FailureClass.UNKNOWN),
        (replayq.JobError("x"), FailureClass.UNKNOWN),
    ],
)
def test_failures_are_classified_by_the_exception_tree_and_defaults(
    exc: Exception, failure_class: FailureClass
) -> None:
    assert classify(exc) is failure_class


def test_contract_mapping_classifies_foreign_exceptions_before_defaults() -> None:
    mapping = {KeyError: FailureClass.DEPENDENCY, TimeoutError: FailureClass.DEPENDENCY}
    assert classify(KeyError("x"), mapping) is FailureClass.DEPENDENCY
    assert classify(TimeoutError(), mapping) is FailureClass.DEPENDENCY
    assert classify(replayq.ValidationError("x"), mapping) is FailureClass.VALIDATION
    assert TimeoutError in DEFAULT_ERROR_MAP


def test_in_doubt_is_its_own_class_and_never_retried_even_if_listed() -> None:
    from replayq.errors import RETRY_TABLE, EffectInDoubtError, FailureClass, classify
    from replayq.queue.contracts import Retry

    assert classify(EffectInDoubtError("x")) is FailureClass.IN_DOUBT
    assert FailureClass.IN_DOUBT in RETRY_TABLE
    assert not Retry(on=("in_doubt", "transient")).retries(FailureClass.IN_DOUBT)
