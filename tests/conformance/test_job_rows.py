"""A job read back from storage is the same record the dataclass builds, on every backend.

The storage builds each ``Job`` it reads without the frozen dataclass ``__init__``
(``Job.built``: ~30 ``object.__setattr__`` a leased job saved); what a caller gets must
still be a whole ``Job``: every field there, none extra, equal to and interchangeable
with the one ``Job(...)`` makes from the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import replayq
from replayq.model import Job, JobState

AppFactory = Callable[..., replayq.App]
FIELDS = [f.name for f in dataclasses.fields(Job)]


def _as_built_by_init(job: Job) -> Job:
    return Job(**{name: getattr(job, name) for name in FIELDS})


def test_a_job_read_back_has_every_field_and_equals_the_one_its_init_builds(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("ship", ordering="order:{order_id}")
    def ship(ctx: replayq.Context, order_id: int) -> dict[str, int]:
        return {"shipped": order_id}

    job_id = app.enqueue("ship", {"order_id": 7}, message_id="evt-1", priority=3)
    queued = app.get_job(job_id)
    assert queued is not None
    stats = replayq.Worker(app, burst=True).run()
    assert stats.succeeded == 1
    done = app.get_job(job_id)
    assert done is not None
    for job in (queued, done):
        assert sorted(vars(job)) == sorted(FIELDS)  # every field, none missing or extra
        assert job == _as_built_by_init(job)
        assert job.evolve(priority=9) == dataclasses.replace(_as_built_by_init(job), priority=9)
    assert done.state is JobState.SUCCEEDED and done.result == {"shipped": 7}
    assert done.payload == {"order_id": 7} and done.message_id == "evt-1"
    assert done.ordering_key == "order:7" and done.attempt == 1
    assert done.to_dict()["state"] == "succeeded"
