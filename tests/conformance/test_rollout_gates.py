"""The ramp moves on evidence: refused while the candidate is worse on a gate, with the
gate and the margin named; ``force`` records the override; ``status`` shows both versions."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main

AppFactory = Callable[..., replayq.App]
BASELINE = replayq.Retry(max_attempts=5, base="30s", cap="60s", jitter="none", on=("transient",))
RETRY_ALL = replayq.Retry(
    max_attempts=5, base="30s", cap="60s", jitter="none", on=("transient", "unknown")
)


def sync_app(app_factory: AppFactory) -> replayq.App:
    app = app_factory()

    @app.job("sync", version="v1", retry=BASELINE)
    def sync_v1(ctx: replayq.Context, n: int) -> int:
        if n % 4 == 0:
            raise ValueError(f"record {n} is malformed")
        return n

    @app.job("sync", version="v2", retry=RETRY_ALL, candidate=True)
    def sync_v2(ctx: replayq.Context, n: int) -> int:
        if n % 4 == 0:
            raise ValueError(f"record {n} is malformed")
        return n

    return app


def run_canary(app: replayq.App, jobs: int = 400) -> None:
    app.rollout("sync", actor="ops").start("v2", canary="50%", reason="canary")
    app.enqueue_many([replayq.EnqueueRequest("sync", {"n": n}) for n in range(jobs)])
    replayq.Worker(app, burst=True, concurrency=4, routing_refresh=0).run()


def test_a_ramp_is_refused_while_the_candidate_retries_more_naming_gate_and_margin(
    app_factory: AppFactory,
) -> None:
    app = sync_app(app_factory)
    run_canary(app)
    rollout = app.rollout("sync", actor="ops")

    with pytest.raises(replayq.RolloutRefusedError) as refused:
        rollout.ramp("75%", reason="looks fine")
    message = str(refused.value)
    assert "ramp to 75% refused" in message
    assert "retry rate: v2 " in message and "vs v1 0.0%" in message
    assert "DLQ rate" not in message, "v2 buries fewer jobs: not worse on that gate"
    routing = rollout.routing()
    assert routing is not None and routing.weights == {"v2": 0.5}, "a refused ramp changes nothing"

    report = rollout.gates()
    [retry] = [g for g in report.gates if g.name == "retry rate"]
    assert not retry.passed and retry.candidate is not None and retry.candidate > 0.1

    forced = rollout.ramp("75%", force=True, reason="accepting the retries for now")
    assert forced.weights == {"v2": 0.75}
    last = rollout.history()[-1]
    # The gates it forced over, named: the retry rate always; the error rate too when the
    # random 50 % split happened to give v2 ~10 points more of the malformed records.
    assert last.action.startswith("ramp (forced over: ")
    assert "retry rate: v2" in last.action
    assert last.reason == "accepting the retries for now" and last.actor == "ops"


def test_a_ramp_needs_a_minimum_sample(app_factory: AppFactory) -> None:
    app = sync_app(app_factory)
    app.rollout("sync").start("v2", canary="5%")
    with pytest.raises(
        replayq.RolloutRefusedError, match="sample: v2 ran 0 attempts, the gates need 50"
    ):
        app.rollout("sync").ramp("25%")


def test_status_shows_routing_and_both_versions_side_by_side(app_factory: AppFactory) -> None:
    app = sync_app(app_factory)
    run_canary(app, jobs=200)
    runner = CliRunner()
    result = runner.invoke(main, ["--db", app.url, "rollout", "status", "sync", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["routing"]["weights"] == {"v2": 0.5}
    figures = body["gates"]
    assert figures["baseline"]["version"] == "v1" and figures["candidate"]["version"] == "v2"
    assert figures["baseline"]["attempts"] + figures["candidate"]["attempts"] == 200
    result = runner.invoke(main, ["--db", app.url, "rollout", "status", "sync"])
    assert "[FAIL] retry rate" in result.output
    assert "retry_rate" in result.output
