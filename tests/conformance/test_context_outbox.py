"""The transactional outbox: rows commit with their step; the job sink publishes each once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from replayq.recording.outbox import JobSink, publish_pending
from tests.context_support import count_rows, named, query, run_once

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    app = app_factory(clock=clock)
    received: list[dict[str, object]] = []
    app.received = received  # type: ignore[attr-defined]

    @app.job("ship", retry=replayq.Retry(max_attempts=1))
    def ship(ctx: replayq.Context, order_id: int, fail_after_publish: bool = False) -> None:
        with ctx.step("mark_shipped"):
            ctx.state.put("order", order_id, {"status": "shipped"})
            ctx.outbox.publish("order.shipped", {"order_id": order_id})
            if fail_after_publish:
                raise replayq.ValidationError("label printer on fire")

    @app.job("order.shipped")
    def on_shipped(ctx: replayq.Context, event_id: str, payload: dict[str, object]) -> None:
        received.append({"event_id": event_id, **payload})

    return app


def test_outbox_rows_commit_with_the_step_and_are_published_exactly_once(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    jobs = [app.enqueue("ship", {"order_id": n}) for n in (1, 2)]
    worker = replayq.Worker(app)
    for _ in jobs:
        run_once(worker)
    written = [named(app, j, "outbox.written")[0] for j in jobs]
    event_ids = [e.data["event_id"] for e in written]
    assert len(set(event_ids)) == 2
    rows = query(app.url, "SELECT event_id, topic, job_id, published_at FROM rq_outbox ORDER BY id")
    assert rows == [
        (event_ids[0], "order.shipped", jobs[0], None),
        (event_ids[1], "order.shipped", jobs[1], None),
    ]

    clock.advance(3)
    first = publish_pending(app, JobSink(app))
    second = publish_pending(app, JobSink(app))
    assert (first.published, first.failed) == (2, 0)
    assert (second.published, second.failed) == (0, 0), "nothing is published twice"
    assert count_rows(app.url, "rq_outbox", "published_at IS NULL") == 0

    consumers = app.list_jobs(job_type="order.shipped")
    assert sorted(j.message_id for j in consumers) == sorted(f"outbox:{e}" for e in event_ids)
    assert sorted(j.causation_id for j in consumers) == sorted(str(j) for j in jobs)
    for _ in consumers:
        run_once(worker)
    assert sorted(app.received, key=lambda r: r["order_id"]) == [  # type: ignore[attr-defined]
        {"event_id": event_ids[0], "order_id": 1},
        {"event_id": event_ids[1], "order_id": 2},
    ]
    published = [
        e for e in app.resource_trace("outbox:order.shipped") if e.name == "outbox.published"
    ]
    assert sorted(e.data["event_id"] for e in published) == sorted(event_ids)
    assert all(e.data["lag"] == pytest.approx(3) for e in published), "publish lag is recorded"


def test_publishing_again_after_a_lost_mark_does_not_enqueue_twice(app: replayq.App) -> None:
    """The job sink dedups on the stable event id even if a row is delivered again."""
    app.enqueue("ship", {"order_id": 5})
    run_once(replayq.Worker(app))
    publish_pending(app, JobSink(app))
    query(app.url, "UPDATE rq_outbox SET published_at = NULL")
    publish_pending(app, JobSink(app))
    assert len(app.list_jobs(job_type="order.shipped")) == 1


def test_a_failed_step_leaves_no_outbox_row(app: replayq.App) -> None:
    job_id = app.enqueue("ship", {"order_id": 3, "fail_after_publish": True})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert count_rows(app.url, "rq_outbox") == 0
    assert app.state.get("order", 3).version == 0
    assert publish_pending(app, JobSink(app)).published == 0
    assert app.list_jobs(job_type="order.shipped") == []
