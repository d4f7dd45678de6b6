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
