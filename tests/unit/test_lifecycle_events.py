"""Lifecycle events are built from a dictionary that names every field (``TraceEvent.built``):
each must be the event the dataclass's own ``__init__`` would build."""

from __future__ import annotations

from dataclasses import fields

from replayq.model import Job, JobState, TraceEvent
from replayq.queue.lifecycle import JOB_LEASED, lifecycle


def a_job() -> Job:
    return Job(
        id=7,
        job_type="order.process",
        queue="default",
        payload={"order_id": 1},
        state=JobState.RUNNING,
        priority=0,
        run_at=1_796_000_000.0,
        created_at=1_796_000_000.0,
        attempt=2,
        max_attempts=3,
        trace_id="0123456789abcdef0123456789abcdef",
    )


def test_a_lifecycle_event_is_the_dataclass_event_with_every_field() -> None:
    job = a_job()
    event = lifecycle(
        JOB_LEASED, job, now=1_796_000_000.5, hlc=123, worker_id="w1", status="running", ttl=60.0
    )
    expected = TraceEvent(
        trace_id=job.trace_id,
        job_id=7,
        attempt=2,
        kind="lifecycle",
        name=JOB_LEASED,
        ts=1_796_000_000.5,
        hlc=123,
        worker_id="w1",
        status="running",
        data={"ttl": 60.0},
    )
    assert vars(event).keys() == {f.name for f in fields(TraceEvent)}
    assert event == expected
    assert lifecycle(JOB_LEASED, job, now=1.0, hlc=1, attempt=5).attempt == 5
