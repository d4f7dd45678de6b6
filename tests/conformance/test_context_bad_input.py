"""Bad input through ``ctx`` gets a clear error naming what was wrong, and loses nothing.

(Effect functions that raise: ``test_context_effects.py``; lock TTLs of zero or
less: ``test_context_state.py``.)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

import replayq
from tests.context_support import count_rows, named, run_once

AppFactory = Callable[..., replayq.App]
LIMIT = 4096


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    return app_factory(clock=replayq.FrozenClock(), blob_limit_bytes=LIMIT)


def test_a_call_response_that_cannot_be_serialised_fails_naming_the_call(
    app: replayq.App,
) -> None:
    @app.job("fetch_rates", retry=replayq.Retry(max_attempts=3))
    def fetch_rates(ctx: replayq.Context) -> None:
        with ctx.step("fetch"):
            ctx.call("fx.rates", lambda: {"as_of": dt.datetime(2024, 1, 1), "eur": 1.1})
            ctx.state.put("rates", "eur", {"eur": 1.1})

    job_id = app.enqueue("fetch_rates", {})
    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD, "retrying cannot make it serialisable"
    assert "ctx.call('fx.rates') response" in job.last_error
    assert "as_of" in job.last_error and "datetime" in job.last_error
    assert job.last_error.startswith("PayloadError")
    assert app.state.get("rates", "eur").version == 0, "the step wrote nothing"
    [finished] = named(app, job_id, "step.finished")
    assert finished.status == "fail" and "fx.rates" in finished.data["error"]


def test_a_call_response_above_the_blob_limit_fails_with_a_clear_error(app: replayq.App) -> None:
    @app.job("export", retry=replayq.Retry(max_attempts=3))
    def export(ctx: replayq.Context) -> None:
        with ctx.step("fetch"):
            ctx.call("warehouse.dump", lambda: {"rows": "x" * (LIMIT * 2)})

    job_id = app.enqueue("export", {})
    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert "ctx.call('warehouse.dump') response" in job.last_error
    assert f"above the blob limit of {LIMIT} bytes" in job.last_error
    assert count_rows(app.url, "rq_blobs") == 0, "nothing half-stored"


def test_values_below_the_limit_but_above_inline_size_go_to_the_blob_store(
    app: replayq.App,
) -> None:
    @app.job("export")
    def export(ctx: replayq.Context) -> int:
        with ctx.step("fetch"):
            response = ctx.call("warehouse.dump", lambda: {"rows": "y" * 3000})
        return len(response["rows"])

    job_id = app.enqueue("export", {})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).result == 3000
    [call] = named(app, job_id, "call")
    assert call.output_ref is not None and call.output_ref.startswith("blob:sha256:")
    assert count_rows(app.url, "rq_blobs") == 1


def test_a_state_value_above_the_blob_limit_is_refused_when_written(app: replayq.App) -> None:
    @app.job("save")
    def save(ctx: replayq.Context) -> None:
        with ctx.step("save"):
            ctx.state.put("doc", "big", {"body": "z" * (LIMIT + 1)})

    job_id = app.enqueue("save", {})
    run_once(replayq.Worker(app))
    job = app.get_job(job_id)
    assert "state doc:big" in job.last_error and "blob limit" in job.last_error
    assert app.state.get("doc", "big").version == 0


@pytest.mark.parametrize(
    ("what", "use"),
    [
        ("decision 'route'", lambda ctx: ctx.decide("route", {1, 2})),
        ("state doc:d", lambda ctx: ctx.state.put("doc", "d", {"at": object()})),
        (
            "outbox doc.saved payload",
            lambda ctx: ctx.outbox.publish("doc.saved", {"n": float("nan")}),
        ),
        ("ctx.effect('email.send') result", lambda ctx: ctx.effect("email.send", object, key="k1")),
    ],
)
def test_values_that_cannot_be_recorded_are_refused_naming_where_they_came_from(
    app: replayq.App, what: str, use: Callable[[replayq.Context], object]
) -> None:
    @app.job("misuse")
    def misuse(ctx: replayq.Context) -> None:
        with ctx.step("misuse"):
            use(ctx)

    job_id = app.enqueue("misuse", {})
    run_once(replayq.Worker(app))
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert what in job.last_error
    assert count_rows(app.url, "rq_outbox") == 0
    assert count_rows(app.url, "rq_entity_versions") == 0
