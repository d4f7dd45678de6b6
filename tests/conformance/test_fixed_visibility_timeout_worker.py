"""``heartbeat=0`` is a fixed visibility timeout: a running worker never moves the deadline.

``tests/unit/test_fixed_visibility_timeout.py`` reads the contract; this runs a real
``Worker`` (its heartbeat thread included) and reads the lease deadline in the database
while the handler runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import replayq
from tests.acceptance.workers import wait_for

AppFactory = Callable[..., replayq.App]


def deadlines_while_running(app: replayq.App, heartbeat: str | int, seconds: float) -> list[float]:
    """Run one job under a real worker; the lease deadlines read while its handler runs."""
    started, release = threading.Event(), threading.Event()

    @app.job("hold", lease="5s", heartbeat=heartbeat)
    def hold(ctx: replayq.Context) -> None:
        started.set()
        assert release.wait(30), "the test never let the handler finish"

    job_id = app.enqueue("hold", {})
    worker = replayq.Worker(app, worker_id="w", poll_interval=0.05)
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    seen: list[float] = []
    try:
        assert started.wait(30), "the job never started"
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            deadline = app.get_job(job_id).lease_deadline
            assert deadline is not None
            seen.append(deadline)
            time.sleep(0.05)
    finally:
        release.set()
        wait_for(
            lambda: app.get_job(job_id).state is replayq.JobState.SUCCEEDED,
            timeout=30,
            what="the held job to succeed",
        )
        worker.stop()
        runner.join(30)
    names = [e.name for e in app.trace(job_id)]
    assert ("lease.extended" in names) == (heartbeat != 0)
    return seen


def test_heartbeat_zero_lease_deadline_never_moves_while_the_job_runs(
    app_factory: AppFactory,
) -> None:
    deadlines = deadlines_while_running(app_factory(), heartbeat=0, seconds=1.0)
    assert len(set(deadlines)) == 1, f"the fixed lease deadline moved: {sorted(set(deadlines))}"


@pytest.mark.parametrize("heartbeat", ["0.1s"])
def test_a_heartbeating_lease_deadline_moves_while_the_job_runs(
    app_factory: AppFactory, heartbeat: str
) -> None:
    """The control: the same measurement sees a heartbeat, so the test above can fail."""
    deadlines = deadlines_while_running(app_factory(), heartbeat=heartbeat, seconds=1.0)
    assert len(set(deadlines)) > 1


def test_fixed_visibility_timeout_jobs_are_never_leased_ahead(app_factory: AppFactory) -> None:
    """A fixed window counts from the lease: a job leased ahead would lose the part of it
    spent waiting for an executor. Slots beyond the free executors take other types only,
    and the fixed jobs' leases start when an executor is free for them."""
    app = app_factory()

    @app.job("fixed", lease="5s", heartbeat=0)
    def fixed(ctx: replayq.Context) -> None:
        return None

    @app.job("beaten", lease="5s", heartbeat="1s")
    def beaten(ctx: replayq.Context) -> None:
        return None

    fixed_ids = [app.enqueue("fixed", {}) for _ in range(3)]
    beaten_ids = [app.enqueue("beaten", {}) for _ in range(2)]
    worker = replayq.Worker(app, worker_id="w", concurrency=1, prefetch=4)

    leased = worker.lease(5, ahead=4)

    assert [job.id for job in leased] == [fixed_ids[0], *beaten_ids]
    states = {job.id: job.state for job in app.list_jobs()}
    assert [states[i] for i in fixed_ids[1:]] == [replayq.JobState.QUEUED] * 2
    # Without a fixed window in the way every slot is filled in the queue's order.
    again = replayq.Worker(app, worker_id="w2", concurrency=1, prefetch=4)
    assert [job.id for job in again.lease(5, ahead=0)] == fixed_ids[1:]


def test_a_fixed_lease_is_not_extended_by_the_beat_of_the_leases_beside_it(
    app_factory: AppFactory,
) -> None:
    """One beat extends every lease a worker holds, but never a fixed visibility timeout."""
    app = app_factory()
    started, release = threading.Barrier(3), threading.Event()

    def holding(ctx: replayq.Context) -> None:
        started.wait(30)
        assert release.wait(30), "the test never let the handler finish"

    app.job("fixed", lease="5s", heartbeat=0)(holding)
    app.job("beaten", lease="5s", heartbeat="0.1s")(holding)
    fixed_id, beaten_id = app.enqueue("fixed", {}), app.enqueue("beaten", {})
    worker = replayq.Worker(app, worker_id="w", concurrency=2, poll_interval=0.05)
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    seen: dict[int, set[float | None]] = {fixed_id: set(), beaten_id: set()}
    try:
        started.wait(30)
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            for job_id in seen:
                seen[job_id].add(app.get_job(job_id).lease_deadline)
            time.sleep(0.05)
    finally:
        release.set()
        wait_for(
            lambda: {app.get_job(i).state for i in seen} == {replayq.JobState.SUCCEEDED},
            timeout=30,
            what="both jobs to succeed",
        )
        worker.stop()
        runner.join(30)
    assert len(seen[beaten_id]) > 1, "the control: the beat ran while both were held"
    assert len(seen[fixed_id]) == 1, f"the fixed lease deadline moved: {seen[fixed_id]}"
    assert "lease.extended" not in [e.name for e in app.trace(fixed_id)]
