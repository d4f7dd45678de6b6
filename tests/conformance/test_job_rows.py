"""A job read back from storage is the same record the dataclass builds, on every backend.

The storage builds each ``Job`` it reads without the frozen dataclass ``__init__``
(``Job.built``: ~30 ``object.__setattr__`` a leased job saved); what a caller gets must
still be a whole ``Job``: every field there, none extra, equal to and interchangeable
with the one ``Job(...)`` makes from the same values.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import replayq
from replayq.model import Job, JobState
from replayq.storage.params import JobLease, JobsComplete

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
    with app.runtime.storage.transaction() as tx:  # the worker's lease: RETURNING every column
        (leased,) = tx.job_lease(JobLease("w", "token", time.time(), 1, 10, 60.0))
    with app.runtime.storage.transaction() as tx:
        assert tx.jobs_complete(JobsComplete(time.time(), [(job_id, "token", '{"shipped":7}', 9)]))
    done = app.get_job(job_id)
    assert queued is not None and done is not None
    for job in (queued, leased, done):
        assert sorted(vars(job)) == sorted(FIELDS)  # every field, none missing or extra
        assert job == _as_built_by_init(job)
        assert job.evolve(priority=9) == dataclasses.replace(_as_built_by_init(job), priority=9)
    assert leased.state is JobState.RUNNING and leased.owner_token == "token"
    assert leased.attempt == 1 and leased.lease_deadline is not None
    assert leased.payload == {"order_id": 7} and leased.result is None
    assert done.state is JobState.SUCCEEDED and done.result == {"shipped": 7}
    assert done.payload == {"order_id": 7} and done.message_id == "evt-1"
    assert done.ordering_key == "order:7" and done.priority == 3
    assert done.to_dict()["state"] == "succeeded"
