"""The Redis cache backend against the real Redis server on 127.0.0.1:6379.

Each test uses its own entity ids, so its keys form a namespace of their own
(``replayq:cache:profile:<id>...``), and deletes them afterwards. Without Redis
they skip on a developer's machine and fail in CI (``tests/conftest.py``, ``missing``).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Callable, Iterator

import pytest

import replayq
from tests.conftest import missing
from tests.context_support import (
    assert_stale_read_recorded,
    count_rows,
    declare_profile_jobs,
    fill_then_update,
    named,
    run_once,
)

REDIS_URL = os.environ.get("REPLAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
PREFIX = "replayq:cache:"

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def redis_client() -> Iterator[object]:
    try:
        redis = importlib.import_module("redis")
    except ImportError as exc:
        missing(f"the redis client is not installed: {exc}", install="pip install 'replayq[redis]'")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        missing(
            f"Redis at {REDIS_URL} is not reachable: {exc}",
            install="apt-get install redis-server, and start it (.ci/run does)",
        )
    yield client
    client.close()


@pytest.fixture
def user_id(redis_client: object) -> Iterator[int]:
    """An id no other test uses; every key derived from it is deleted afterwards."""
    ident = uuid.uuid4().int % 10**12
    yield ident
    keys = list(redis_client.scan_iter(f"{PREFIX}*profile:{ident}*"))  # type: ignore[attr-defined]
    if keys:
        redis_client.delete(*keys)  # type: ignore[attr-defined]


@pytest.fixture
def app(app_factory: AppFactory, redis_client: object) -> replayq.App:
    app = app_factory(clock=replayq.FrozenClock(), cache_url=REDIS_URL)
    declare_profile_jobs(app)
    return app


def test_stale_read_on_redis_is_detected_and_recorded(
    app: replayq.App, redis_client: object, user_id: int
) -> None:
    fill_then_update(app, user_id)
    stored = redis_client.hget(f"{PREFIX}profile:{user_id}:v1", "entry")  # type: ignore[attr-defined]
    assert stored is not None, "the entry lives in Redis, not in the database"
    assert app.cache_backend.__class__.__name__ == "RedisCache"
    assert count_rows(app.url, "rq_cache") == 0

    assert_stale_read_recorded(app, user_id)


def test_invalidate_on_redis_drops_every_version_after_the_step_commits(
    app: replayq.App, redis_client: object, user_id: int
) -> None:
    @app.job("rename_user")
    def rename_user(ctx: replayq.Context, user_id: int, name: str) -> None:
        with ctx.step("rename"):
            user = ctx.state.get("user", user_id)
            ctx.state.put("user", user_id, {"name": name}, expected_version=user.version)
            ctx.cache.invalidate("profile", user_id)

    fill_then_update(app, user_id)
    assert redis_client.exists(f"{PREFIX}profile:{user_id}:v1") == 1  # type: ignore[attr-defined]
    app.enqueue("rename_user", {"user_id": user_id, "name": "Countess"})
    run_once(replayq.Worker(app))

    assert redis_client.exists(f"{PREFIX}profile:{user_id}:v1") == 0  # type: ignore[attr-defined]
    job_id = app.enqueue("show_profile", {"user_id": user_id, "versioned": False})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).result == {
        "hit": False,
        "value": None,
        "version": None,
        "stale": False,
    }


@pytest.mark.parametrize(
    "foreign", ['{"payload": "v0 layout"}', "\x80\x04 not json"], ids=["other-shape", "not-json"]
)
def test_an_entry_redis_holds_in_another_format_reads_as_a_recorded_miss(
    app: replayq.App, redis_client: object, user_id: int, foreign: str
) -> None:
    fill_then_update(app, user_id)
    # Another writer (an older deployment, another service) left its own format under the key.
    redis_client.hset(f"{PREFIX}profile:{user_id}:v1", "entry", foreign)  # type: ignore[attr-defined]
    job_id = app.enqueue("show_profile", {"user_id": user_id, "versioned": False})
    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert job.state == "succeeded", job.last_error
    assert job.result == {"hit": False, "value": None, "version": None, "stale": False}
    [error] = named(app, job_id, "cache.decode_error")
    assert error.data["key"] == f"profile:{user_id}"
    assert error.status == "fail"
    assert "v0 layout" not in error.data["error"] and "not json" not in error.data["error"]
    [read] = named(app, job_id, "cache.read")
    assert read.status == "miss"
