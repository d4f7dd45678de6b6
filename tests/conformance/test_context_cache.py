"""The versioned cache on the database backend: recorded reads, stale reads detected."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from tests.context_support import (
    assert_stale_read_recorded,
    declare_profile_jobs,
    fill_then_update,
    named,
    run_once,
)

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    app = app_factory(clock=replayq.FrozenClock())
    declare_profile_jobs(app)
    return app


def test_stale_read_on_the_database_cache_is_detected_and_recorded(app: replayq.App) -> None:
    fill_then_update(app, 1)
    assert_stale_read_recorded(app, 1)


def test_a_fresh_read_is_a_recorded_hit_and_not_stale(app: replayq.App) -> None:
    app.state.put("user", 2, {"name": "Grace"}, expected_version=0)
    app.enqueue("render_profile", {"user_id": 2})
    run_once(replayq.Worker(app))

    job_id = app.enqueue("show_profile", {"user_id": 2, "versioned": True})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).result == {
        "hit": True,
        "value": {"name": "Grace"},
        "version": 1,
        "stale": False,
    }
    [read] = named(app, job_id, "cache.read")
    assert (read.resource, read.status, read.resource_version) == ("profile:2:v1", "hit", 1)
    assert named(app, job_id, "cache.stale_read") == []


def test_cache_writes_of_a_failed_step_never_land(app: replayq.App) -> None:
    @app.job("render_then_fail", retry=replayq.Retry(max_attempts=1))
    def render_then_fail(ctx: replayq.Context, user_id: int) -> None:
        with ctx.step("render"):
            ctx.cache.set("profile", user_id, {"name": "half-done"}, version=1, source="user")
            raise replayq.ValidationError("template missing")

    app.state.put("user", 3, {"name": "Edsger"}, expected_version=0)
    app.enqueue("render_then_fail", {"user_id": 3})
    run_once(replayq.Worker(app))

    job_id = app.enqueue("show_profile", {"user_id": 3, "versioned": False})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).result["hit"] is False


def test_an_entry_expires_after_the_contracts_cache_ttl_or_its_own(app: replayq.App) -> None:
    """``cache_ttl`` (docs/contracts.md) is how long an entry written under the contract
    is read: a miss once it has run out; ``ttl=`` on the write wins over it."""
    clock = app.runtime.clock
    assert isinstance(clock, replayq.FrozenClock)

    @app.job("fill", cache_ttl="1m")
    def fill(ctx: replayq.Context, sku: str, ttl: float | None = None) -> None:
        with ctx.step("fill"):
            ctx.cache.set("quote", sku, {"price": 5}, ttl=ttl)

    @app.job("peek")
    def peek(ctx: replayq.Context, sku: str) -> bool:
        return ctx.cache.get("quote", sku).hit

    def hit(sku: str) -> bool:
        job_id = app.enqueue("peek", {"sku": sku})
        run_once(replayq.Worker(app))
        return bool(app.get_job(job_id).result)

    app.enqueue("fill", {"sku": "a"})
    app.enqueue("fill", {"sku": "b", "ttl": 300})
    run_once(replayq.Worker(app))
    run_once(replayq.Worker(app))
    assert (hit("a"), hit("b")) == (True, True)
    clock.advance(59)
    assert (hit("a"), hit("b")) == (True, True)
    clock.advance(2)
    assert (hit("a"), hit("b")) == (False, True), "the contract's TTL ran out; ttl= did not"
    clock.advance(300)
    assert hit("b") is False
