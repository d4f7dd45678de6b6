"""Every way a job gets into ``rq_jobs`` gives it exactly one ``job.enqueued`` event,
whose data is its row's: ``App.enqueue`` (one statement committed by itself on SQLite,
its pack written by the trigger ``rq_jobs_enqueued``), ``enqueue_many``, a handler's
``ctx.enqueue`` (in the step's transaction), a periodic schedule's slot and the outbox's
job sink; a duplicate message id adds a ``job.deduplicated``, never a second
``job.enqueued``. On both backends."""

from __future__ import annotations

from collections.abc import Callable

import replayq
from replayq.queue.scheduler import Scheduler
from replayq.recording.outbox import JobSink, publish_pending

START = 1_700_000_040.0  # a whole minute


def test_every_insert_path_gives_each_job_one_enqueued_event_with_its_rows_data(
    app_factory: Callable[..., replayq.App],
) -> None:
    clock = replayq.FrozenClock(START + 0.25)
    app = app_factory(clock=clock)

    @app.job("parent", ordering="{key}")
    def parent(ctx: replayq.Context, key: str) -> None:
        with ctx.step("fan out"):
            ctx.enqueue("leaf", {"n": 1}, priority=3)
            ctx.outbox.publish("parent.done", {"key": key})

    @app.job("leaf")
    def leaf(ctx: replayq.Context, n: int) -> None: ...

    @app.job("parent.done")
    def done(ctx: replayq.Context, event_id: str, payload: dict[str, object]) -> None: ...

    app.periodic("* * * * * *")(app.job("beat")(lambda ctx: None))

    app.enqueue("parent", {"key": "a"}, message_id="p-a", priority=-2, run_at=START)
    app.enqueue("parent", {"key": "a"}, message_id="p-a")  # a duplicate
    app.enqueue_many(
        [
            replayq.EnqueueRequest("leaf", {"n": 2}, message_id="l-2", delay=5),
            replayq.EnqueueRequest("leaf", {"n": 2}, message_id="l-2"),  # a duplicate
            replayq.EnqueueRequest("leaf", {"n": 3}),
        ]
    )
    scheduler = Scheduler(app.runtime, app.schedules)
    scheduler.register()
    clock.set(START + 2.5)
    scheduler.tick()
    worker = replayq.Worker(app, burst=True)
    worker.run()
    clock.advance(3)
    assert publish_pending(app, JobSink(app)).published == 1

    jobs = app.list_jobs(limit=100)
    kinds = sorted(j.job_type for j in jobs if j.job_type != "beat")
    assert kinds == ["leaf", "leaf", "leaf", "parent", "parent.done"]
    assert [j.causation_id for j in jobs if j.job_type == "beat"] == ["schedule:beat"]
    for job in jobs:
        events = app.trace(job.id)
        enqueued = [e for e in events if e.name == "job.enqueued"]
        assert len(enqueued) == 1, (job.job_type, [e.name for e in events])
        [event] = enqueued
        assert event.data == {
            "run_at": job.run_at,
            "priority": job.priority,
            "message_id": job.message_id,
            "ordering_key": job.ordering_key,
            "causation_id": job.causation_id,
        }, job
        assert (event.attempt, event.hlc, event.trace_id) == (0, events[0].hlc, job.trace_id)
        deduplicated = [e.name for e in events if e.name == "job.deduplicated"]
        assert len(deduplicated) == (1 if job.message_id in ("p-a", "l-2") else 0)
