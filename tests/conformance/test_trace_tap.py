"""The trace tap reports events only once their transaction committed, and stops when removed."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

import replayq

AppFactory = Callable[..., replayq.App]


def test_only_committed_events_are_reported_and_a_removed_listener_hears_nothing(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        return None

    heard: list[str] = []

    def listener(events: Sequence[replayq.TraceEvent]) -> None:
        heard.extend(e.name for e in events)

    app.runtime.add_tap(listener)
    app.enqueue("noop", {})
    assert heard == ["job.enqueued"]
    with pytest.raises(RuntimeError), app.storage.transaction() as tx:
        app.insert_job(tx, replayq.EnqueueRequest("noop", {}))
        raise RuntimeError("rolled back")
    assert heard == ["job.enqueued"]
    app.runtime.remove_tap(listener)
    app.enqueue("noop", {})
    assert heard == ["job.enqueued"]
    assert len(app.list_jobs()) == 2


def test_a_bulk_enqueue_reports_each_new_job_and_each_duplicate_with_its_job_id(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None:
        return None

    heard: list[tuple[str, int | None]] = []
    app.runtime.add_tap(lambda events: heard.extend((e.name, e.job_id) for e in events))
    first = app.enqueue("noop", {"n": 0}, message_id="m0")
    ids = app.enqueue_many(
        [replayq.EnqueueRequest("noop", {"n": n}, message_id=f"m{n % 3}") for n in range(1, 5)]
    )
    assert ids[2] == first and ids[3] == ids[0]
    assert heard == [
        ("job.enqueued", first),
        ("job.enqueued", ids[0]),
        ("job.enqueued", ids[1]),
        ("job.deduplicated", first),
        ("job.deduplicated", ids[0]),
    ]
