"""Routing as data on every backend: a canary's share, pins, a version kept for all attempts.

A job's version is chosen once, at its first lease, and kept through retries
and ramps; a pinned key never moves; every change is an event with who and why.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from replayq.model import TraceEvent
from replayq.storage.protocol import TraceQuery

AppFactory = Callable[..., replayq.App]


def versioned_app(app_factory: AppFactory, **kwargs: object) -> replayq.App:
    app = app_factory(**kwargs)
    retry = replayq.Retry(max_attempts=4, base="1s", cap="1s", jitter="none", on=("transient",))

    @app.job("charge", version="v1", retry=retry, ordering="{tenant}:{order}")
    def charge_v1(ctx: replayq.Context, tenant: str, order: int, fail_first: bool = False) -> str:
        if fail_first and ctx.attempt == 1:
            raise replayq.TransientError("gateway timed out")
        return "v1"

    @app.job("charge", version="v2", retry=retry, ordering="{tenant}:{order}", candidate=True)
    def charge_v2(ctx: replayq.Context, tenant: str, order: int, fail_first: bool = False) -> str:
        if fail_first and ctx.attempt == 1:
            raise replayq.TransientError("gateway timed out")
        return "v2"

    return app


def leased_versions(app: replayq.App, job_id: int) -> list[str]:
    return [e.data["version"] for e in app.trace(job_id) if e.name == "job.leased"]


def test_canary_of_ten_percent_over_2000_jobs_stays_within_a_binomial_bound(
    app_factory: AppFactory,
) -> None:
    app = versioned_app(app_factory)
    rollout = app.rollout("charge", actor="ci")
    rollout.start("v2", canary="10%", reason="canary of the new gateway client")
    requests = [
        replayq.EnqueueRequest("charge", {"tenant": f"t{i % 97}", "order": i}) for i in range(2000)
    ]
    ids = app.enqueue_many(requests)

    stats = replayq.Worker(app, burst=True, concurrency=4, routing_refresh=0).run()

    assert stats.succeeded == 2000
    jobs = [app.get_job(i) for i in ids]
    by_version = Counter(job.handler_version for job in jobs)
    assert set(by_version) == {"v1", "v2"}
    # 99.9 % two-sided binomial bound: z = 3.29.
    n, p = 2000, 0.10
    bound = 3.29 * math.sqrt(n * p * (1 - p))
    assert abs(by_version["v2"] - n * p) <= bound, by_version
    # The version in the row is the one that ran, and the trace says so.
    assert all(job.result == job.handler_version for job in jobs)
    assert all(leased_versions(app, job.id) == [job.handler_version] for job in jobs[:50])
    [change] = rollout.history()
    assert (change.action, change.actor, change.reason) == (
        "start",
        "ci",
        "canary of the new gateway client",
    )
    assert change.routing["weights"] == {"v2": 0.1}


def test_a_pinned_key_stays_on_its_version_through_retries_and_ramps(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock()
    app = versioned_app(app_factory, clock=clock)
    rollout = app.rollout("charge", actor="ci")
    rollout.start("v2", canary="0%", reason="pin first")
    rollout.pin("tenant", values=["acme"], to="v2", reason="acme asked for the new client")
    pinned = [
        app.enqueue("charge", {"tenant": "acme", "order": i, "fail_first": True}) for i in range(5)
    ]
    others = [
        app.enqueue("charge", {"tenant": f"o{i}", "order": i, "fail_first": True})
        for i in range(20)
    ]
    worker = replayq.Worker(app, routing_refresh=0)

    for job in worker.lease(100):  # first attempts: every one fails and is retried
        worker.execute(job)
    rollout.ramp("60%", force=True, reason="ramp between attempts")
    clock.advance(2)
    for job in worker.lease(100):
        worker.execute(job)
    rollout.ramp("0%", reason="back down")

    for job_id in pinned:
        assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
        assert leased_versions(app, job_id) == ["v2", "v2"]
    for job_id in others:
        # Chosen once at the first lease (0 % canary: v1) and kept through the ramp to 60 %.
        assert leased_versions(app, job_id) == ["v1", "v1"]
    actions = [c.action for c in rollout.history()]
    assert actions[:2] == ["start", "pin"]
    assert actions[2].startswith("ramp (forced over: sample")
    assert actions[3] == "ramp"


def test_a_ramp_only_moves_keys_from_the_baseline_to_the_candidate(
    app_factory: AppFactory,
) -> None:
    app = versioned_app(app_factory)
    rollout = app.rollout("charge")
    rollout.start("v2", canary="10%")
    routing = rollout.routing()
    assert routing is not None
    jobs = [
        replayq.Job(
            i,
            "charge",
            "default",
            {},
            replayq.JobState.QUEUED,
            0,
            0.0,
            0.0,
            0,
            1,
            f"trace-{i}",
            ordering_key=f"key-{i}",
        )
        for i in range(500)
    ]
    at_10 = {job.id: routing.choose(job) for job in jobs}
    at_50 = {job.id: routing.evolve(weights={"v2": 0.5}).choose(job) for job in jobs}
    assert all(at_50[i] == "v2" for i, v in at_10.items() if v == "v2")


def test_a_routing_change_is_a_compare_and_set_with_an_event(app_factory: AppFactory) -> None:
    app = versioned_app(app_factory)
    rollout = app.rollout("charge", actor="alice")
    first = rollout.start("v2", canary="5%", reason="go")
    second = app.rollout("charge", actor="bob").shadow("v2", fraction="10%", reason="shadow")
    assert (first.revision, second.revision) == (1, 2)
    routing = rollout.routing()
    assert routing is not None
    assert routing.weights == {"v2": 0.05} and routing.shadow_fraction == 0.10
    assert [(c.revision, c.actor) for c in rollout.history()] == [(1, "alice"), (2, "bob")]
    events: list[TraceEvent] = []
    with app.storage.transaction(readonly=True) as tx:
        events = tx.trace_query(TraceQuery(trace_id="rollout:charge"))
    assert [e.status for e in events] == ["start", "shadow"]


def test_unknown_versions_and_ramps_without_a_rollout_are_refused(app_factory: AppFactory) -> None:
    app = versioned_app(app_factory)
    with pytest.raises(replayq.RolloutRefusedError, match="no version 'v9'"):
        app.rollout("charge").start("v9", canary="5%")
    with pytest.raises(replayq.RolloutRefusedError, match="no routing yet"):
        app.rollout("charge").ramp("50%")
    with pytest.raises(replayq.ConfigurationError, match="between 0% and 100%"):
        app.rollout("charge").start("v2", canary="150%")


def test_dead_v2_jobs_are_listed_by_version_and_requeued_to_v1(app_factory: AppFactory) -> None:
    app = app_factory()

    @app.job("import", version="v1")
    def import_v1(ctx: replayq.Context, n: int) -> str:
        return "v1"

    @app.job("import", version="v2", candidate=True)
    def import_v2(ctx: replayq.Context, n: int) -> str:
        raise replayq.ValidationError("v2 cannot parse this")

    app.rollout("import").start("v2", canary="100%", reason="all in")
    ids = [app.enqueue("import", {"n": n}) for n in range(4)]
    replayq.Worker(app, burst=True, routing_refresh=0).run()
    runner = CliRunner()
    listed = runner.invoke(
        main,
        [
            "--db",
            app.url,
            "jobs",
            "list",
            "--type",
            "import",
            "--state",
            "dead",
            "--version",
            "v2",
            "--json",
        ],
    )
    assert listed.exit_code == 0, listed.output
    assert sorted(job["id"] for job in json.loads(listed.output)) == sorted(ids)

    app.rollout("import").rollback(reason="v2 fails everything")
    moved = runner.invoke(
        main,
        [
            "--db",
            app.url,
            "dead",
            "requeue",
            "--type",
            "import",
            "--version",
            "v2",
            "--to-version",
            "v1",
            "--reason",
            "back to v1",
        ],
    )
    assert moved.exit_code == 0, moved.output
    replayq.Worker(app, burst=True, routing_refresh=0).run()
    for job_id in ids:
        job = app.get_job(job_id)
        assert (job.state, job.handler_version, job.result) == (
            replayq.JobState.SUCCEEDED,
            "v1",
            "v1",
        )
        assert leased_versions(app, job_id) == ["v2", "v1"]
    assert app.list_jobs(job_type="import", version="v2") == []
