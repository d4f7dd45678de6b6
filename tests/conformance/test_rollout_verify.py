"""``rollout verify`` over recorded baseline attempts, sealed, on every backend.

It flags a candidate that retries every exception (class ``retry_decision``)
and one that caches a new value shape under the same key (``cache_shape``),
passes a candidate identical in behaviour, and reaches no real service — not
even from a candidate that bypasses ``ctx``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from tests.apps import rollout_app
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    """Twelve recorded v1 jobs: eight succeeded, four failed validation (dead, not retried)."""
    app = rollout_app.declare(app_factory())
    for i in range(12):
        app.enqueue("price", {"sku": f"sku-{i % 3}", "qty": -1 if i % 3 == 0 else i})
    stats = replayq.Worker(app, burst=True).run()
    assert (stats.succeeded, stats.dead) == (8, 4)
    return app


def test_a_candidate_that_retries_every_exception_is_flagged_as_retry_decision(
    app: replayq.App, service: Service
) -> None:
    calls = service.total()
    report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2-retry")

    assert report.attempts == 12
    assert report.counts == {"retry_decision": 4}
    assert not report.passed
    [example, *_] = report.examples()
    assert example.details["retry_decision"]["recorded"] == "dead: not_retryable"
    assert example.details["retry_decision"]["now"].startswith("retry in ≤ 1.0 s (attempt 2 of 5)")
    assert example.fork_command.startswith(f"replayq fork {example.job_id} --attempt 1")
    assert service.total() == calls, "verify reached the real service"


def test_a_new_cache_value_shape_under_the_same_key_is_flagged(
    app: replayq.App, service: Service
) -> None:
    calls = service.total()
    report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2-shape")

    assert report.counts == {"cache_shape": 8}
    [example, *_] = report.examples()
    [(key, shapes)] = example.details["cache_shape"].items()
    assert key.startswith("price:sku-")
    assert shapes == {
        "recorded": {"amount": "int"},
        "now": {"amount": {"currency": "str", "value": "int"}},
    }
    assert report.first_divergence_steps == {"(same steps)": 8}
    assert service.total() == calls


def test_an_identical_candidate_passes(app: replayq.App, service: Service) -> None:
    report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2-same")
    assert report.attempts == 12
    assert report.counts == {}
    assert report.passed


def test_a_candidate_bypassing_ctx_is_refused_and_reaches_nothing(
    app: replayq.App, service: Service
) -> None:
    calls = service.total()
    report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2-leaky")
    assert report.counts["unrecorded_io"] == 12
    assert report.first_divergence_steps["quote"] == 12
    assert service.total() == calls, "a sealed run let a request through"


def test_cli_exits_1_on_disallowed_classes_and_0_when_they_are_allowed(
    app: replayq.App, service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    base = [
        "--db",
        app.url,
        "rollout",
        "verify",
        "price",
        "--app",
        "tests.apps.rollout_app:app",
        "--from",
        "v1",
        "--to",
        "v2-retry",
    ]
    result = runner.invoke(main, [*base, "--json"])
    assert result.exit_code == 1, result.output
    body = json.loads(result.output)
    assert body["counts"] == {"retry_decision": 4} and body["passed"] is False

    result = runner.invoke(main, [*base, "--allow", "retry_decision"])
    assert result.exit_code == 0, result.output
    assert "retry_decision" in result.output and "replayq fork" in result.output

    result = runner.invoke(main, [*base, "--sample", "3", "--state", "dead", "--json"])
    assert json.loads(result.output)["attempts"] == 3


def test_a_background_verification_with_a_field_from_a_later_release_still_runs(
    app: replayq.App,
) -> None:
    """A command line newer than the worker may add payload fields (as ``app`` was added):
    the worker runs the verification without them instead of burying it."""
    payload = {"job_type": "price", "from_version": "v1", "to_version": "v1", "added_later": 1}
    job_id = app.enqueue("replayq.verify", payload)
    replayq.Worker(app, burst=True).run()

    run = replayq.verify_run(app, job_id)
    assert (run.state, run.verdict, run.passed, run.done) == ("succeeded", "passed", True, 12)
