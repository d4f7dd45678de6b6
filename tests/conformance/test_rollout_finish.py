"""``rollout finish``: the candidate becomes the baseline and the only route, behind the gates.

The other end of a rollout than ``rollback``: refused while a gate says the
candidate is worse (``--force`` records the override), then one change makes the
candidate the baseline, clears weights, pins, shadow and dual-run, and moves queued
jobs of the old version to it (their next attempt runs it); the change is recorded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from tests.conformance.test_rollout_gates import run_canary

AppFactory = Callable[..., replayq.App]
SLOW_RETRY = replayq.Retry(max_attempts=5, base="60s", cap="60s", jitter="none", on=("transient",))
RETRY_ALL = replayq.Retry(
    max_attempts=5, base="60s", cap="60s", jitter="none", on=("transient", "unknown")
)


def sync_app(app_factory: AppFactory, candidate_retry: replayq.Retry) -> replayq.App:
    """Every twentieth first attempt of each version fails transiently (a retry waits a
    minute); every fifth job raises ``ValueError`` (v1 buries it; a retry-all v2 retries
    it). The transient failures are counted per version, not drawn from the job numbers:
    the 50 % canary's random split could give one version 16 of 20 such jobs (~1 % of
    runs), and the gates would rightly refuse a finish the test means to be green."""
    app = app_factory()
    first_attempts = {"v1": itertools.count(1), "v2": itertools.count(1)}

    def body(ctx: replayq.Context, n: int, version: str) -> int:
        if n % 5 == 2:
            raise ValueError(f"record {n} is malformed")
        if ctx.attempt == 1 and next(first_attempts[version]) % 20 == 0:
            raise replayq.TransientError("upstream timed out")
        return n

    @app.job("sync", version="v1", retry=SLOW_RETRY)
    def sync_v1(ctx: replayq.Context, n: int) -> int:
        return body(ctx, n, "v1")

    @app.job("sync", version="v2", retry=candidate_retry, candidate=True)
    def sync_v2(ctx: replayq.Context, n: int) -> int:
        return body(ctx, n, "v2")

    return app


def test_finish_makes_the_candidate_the_only_route_and_moves_the_old_versions_queue(
    app_factory: AppFactory, db_url: str
) -> None:
    app = sync_app(app_factory, SLOW_RETRY)
    run_canary(app)
    waiting_v1 = app.list_jobs(job_type="sync", states=["queued"], version="v1")
    assert waiting_v1, "no v1 retry was waiting: nothing to move"

    result = CliRunner().invoke(
        main,
        ["--db", db_url, "rollout", "finish", "sync", "--by", "ops", "--reason", "gates green"],
    )
    assert result.exit_code == 0, result.output
    assert f"moved {len(waiting_v1)} queued job(s) to v2" in result.output

    routing = app.rollout("sync").routing()
    assert routing is not None
    assert (routing.baseline, routing.candidate, dict(routing.weights)) == ("v2", None, {})
    assert routing.pins == () and routing.shadow_version is None
    assert app.list_jobs(job_type="sync", states=["queued"], version="v1") == []
    last = app.rollout("sync").history()[-1]
    assert (last.action, last.actor, last.reason) == ("finish", "ops", "gates green")

    fresh = app.enqueue_many([replayq.EnqueueRequest("sync", {"n": n}) for n in range(1, 40, 5)])
    replayq.Worker(app, burst=True, routing_refresh=0).run()
    versions = {e.data["version"] for i in fresh for e in app.trace(i) if e.name == "job.leased"}
    assert versions == {"v2"}


def test_finish_is_refused_while_a_gate_fails_and_force_records_the_override(
    app_factory: AppFactory,
) -> None:
    app = sync_app(app_factory, RETRY_ALL)
    run_canary(app)
    rollout = app.rollout("sync", actor="ops")

    with pytest.raises(replayq.RolloutRefusedError) as refused:
        rollout.finish(reason="ship it")
    assert "finish on v2 refused" in str(refused.value)
    assert "retry rate: v2 " in str(refused.value)
    routing = rollout.routing()
    assert routing is not None and routing.candidate == "v2" and routing.baseline == "v1"

    done = rollout.finish(force=True, reason="accepted")
    assert done.routing.baseline == "v2" and done.routing.candidate is None
    # Other gates may fail too (the canary's split of the transient failures is random).
    action = rollout.history()[-1].action
    assert action.startswith("finish (forced over: ") and "retry rate: v2 " in action


def test_finish_needs_a_rollout_under_way(app_factory: AppFactory) -> None:
    app = sync_app(app_factory, SLOW_RETRY)
    with pytest.raises(replayq.RolloutRefusedError, match="no routing yet"):
        app.rollout("sync").finish()
