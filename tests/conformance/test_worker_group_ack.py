"""What a running worker's group commits leave behind, on every backend: one log line per
group naming every job it acked, and heartbeats for jobs leased while the beat sleeps.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import replayq
from tests.acceptance.workers import wait_for

AppFactory = Callable[..., replayq.App]
JOBS = 24


def test_a_group_commit_logs_its_successes_in_one_line_naming_each_job(
    app_factory: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_factory()

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None:
        return None

    ids = {app.enqueue("noop", {"n": n}) for n in range(JOBS)}
    worker = replayq.Worker(app, burst=True, prefetch=7, prefetch_window=float("inf"))
    with caplog.at_level(logging.INFO, logger="replayq.worker"):
        stats = worker.run()
    assert stats.succeeded == JOBS
    lines = [r.getMessage() for r in caplog.records if "succeeded" in r.getMessage()]
    named = [int(n) for line in lines for n in re.findall(r"(?:job |: |, )(\d+) ", line)]
    assert sorted(named) == sorted(ids), lines  # every success is logged, each once
    # Leased eight at a time and acked together: far fewer lines than jobs.
    assert len(lines) <= JOBS // 2, lines


def test_a_job_leased_while_the_heartbeat_sleeps_is_beaten_on_its_own_tick(
    app_factory: AppFactory,
) -> None:
    """The heartbeat thread is woken by a new lease only when that lease's first beat is
    due before the thread wakes by itself: a short heartbeat still beats on time."""
    app = app_factory()
    started, release = threading.Event(), threading.Event()

    @app.job("hold", lease="1s", heartbeat="0.1s")
    def hold(ctx: replayq.Context) -> None:
        started.set()
        assert release.wait(30), "the test never let the handler finish"

    worker = replayq.Worker(app, worker_id="w", poll_interval=0.05)
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    try:
        time.sleep(0.3)  # the heartbeat thread is asleep for up to a second, nothing held
        job_id = app.enqueue("hold", {})
        assert started.wait(30), "the job never started"
        time.sleep(0.6)
        beats = [e for e in app.trace(job_id) if e.name == "lease.extended"]
        # Without a wake-up the first beat would come only after the idle sleep (1 s).
        assert len(beats) >= 3, [e.name for e in app.trace(job_id)]
    finally:
        release.set()
        wait_for(
            lambda: app.get_job(job_id).state is replayq.JobState.SUCCEEDED,
            timeout=30,
            what="the held job to succeed",
        )
        worker.stop()
        runner.join(30)


def test_a_buffered_ack_commits_within_its_window_while_the_executor_runs_a_long_job(
    app_factory: AppFactory,
) -> None:
    """The acks thread is not woken for every batch any more; an ack still waits at most
    about ``ack_window`` when its executor goes on to a job that runs long."""
    app = app_factory()
    started, release = _quick_and_held_types(app)

    # A stream of quick jobs first: the acks thread is then in its busy rhythm.
    # 24: the last batch of five is four quick jobs and the long one, run after them.
    quick_ids = [app.enqueue("quick", {}) for _ in range(24)]
    held = app.enqueue("hold", {})
    worker = replayq.Worker(
        app, prefetch=4, prefetch_window=float("inf"), ack_window=0.05, poll_interval=0.05
    )
    with _running_until_released(worker, started, release):
        ran_at = time.monotonic()
        wait_for(
            lambda: all(app.get_job(i).state is replayq.JobState.SUCCEEDED for i in quick_ids),
            timeout=5,
            what="the quick jobs' acks to commit while the long job runs",
        )
        assert time.monotonic() - ran_at < 0.3  # the window (0.05 s), not the idle wake (1 s)
        assert app.get_job(held).state is replayq.JobState.RUNNING


def test_the_jobs_of_a_group_commit_each_keep_their_trace_and_resource_timeline(
    app_factory: AppFactory,
) -> None:
    """A group's acks are one compare-and-set statement and their packs one insert: each
    job still reads back its own events in order, each resource only its own job's write,
    and each job its own result."""
    app = app_factory()

    @app.job("credit")
    def credit(ctx: replayq.Context, n: int) -> int:
        ctx.state.put("acct", str(n), {"balance": n})  # outside a step: commits with the ack
        return n * 10

    ids = {app.enqueue("credit", {"n": n}): n for n in range(JOBS)}
    worker = replayq.Worker(app, burst=True, prefetch=7, prefetch_window=float("inf"))
    assert worker.run().succeeded == JOBS
    finished = set()
    for job_id, n in ids.items():
        job = app.get_job(job_id)
        assert (job.state, job.result) == (replayq.JobState.SUCCEEDED, n * 10)
        finished.add(job.finished_at)
        names = [e.name for e in app.trace(job_id)]
        assert names[0] == "job.enqueued" and names[-1] == "job.succeeded", names
        assert names.index("job.leased") < names.index("state.write") < len(names) - 1
        timeline = app.resource_trace(f"acct:{n}")
        assert {e.job_id for e in timeline} == {job_id}, timeline
        assert [e.data["delta"] for e in timeline] == [{"replace": {"balance": n}}]
    assert len(finished) < JOBS  # acked in groups, each group at one time


def test_a_group_commit_that_leases_writes_its_acks_and_leases_packs_in_one_insert(
    pg_schema_url: str,
) -> None:
    """On PostgreSQL each statement is a round trip: a group commit that also leases the
    next batch appends its acks' ``job.succeeded`` packs with that batch's ``job.leased``
    packs, in one insert (rows of one statement share their command id, ``cmin``)."""
    import psycopg

    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None:
        return None

    for n in range(JOBS):
        app.enqueue("noop", {"n": n})
    worker = replayq.Worker(app, burst=True, prefetch=3, prefetch_window=float("inf"))
    assert worker.run().succeeded == JOBS
    app.close()
    with psycopg.connect(pg_schema_url) as conn:
        rows = conn.execute(
            "SELECT p.xmin::text, p.cmin::text, e.ev ->> 'n' FROM rq_trace AS p "
            "CROSS JOIN LATERAL jsonb_array_elements(p.events::jsonb) AS e(ev) "
            "WHERE e.ev ->> 'n' IN ('job.succeeded', 'job.leased')"
        ).fetchall()
    commands: dict[str, dict[str, set[str]]] = {}
    for xid, cmin, name in rows:
        commands.setdefault(xid, {}).setdefault(name, set()).add(cmin)
    both = [names for names in commands.values() if len(names) == 2]
    assert both, "no group commit leased the next batch"
    for names in both:
        assert len(names["job.succeeded"] | names["job.leased"]) == 1, names


class _SlowRefills(replayq.Worker):
    """A worker whose leases take a while (a slow database) and which counts its groups."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.groups: list[int] = []

    def _commit_group(self, acks: list[Any], *, refill: bool) -> list[replayq.Job]:
        self.groups.append(len(acks))
        return super()._commit_group(acks, refill=refill)

    def _lease_in(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.03)
        return super()._lease_in(*args, **kwargs)


def test_executors_that_free_their_slots_during_a_refill_take_its_jobs_not_a_group_each(
    app_factory: AppFactory,
) -> None:
    """While one executor commits the group and leases the next batch, the others that
    finish wait for that batch and leave their acks to the next group: each used to
    commit its own ack alone after it and lease its one slot (groups of one)."""
    app = app_factory()

    @app.job("short")
    def short(ctx: replayq.Context, n: int) -> None:
        time.sleep(0.002)  # long enough for the four executors to share each batch

    jobs = 96
    app.enqueue_many([replayq.EnqueueRequest("short", {"n": n}) for n in range(jobs)])
    worker = _SlowRefills(
        app,
        burst=True,
        concurrency=4,
        prefetch=8,
        prefetch_window=float("inf"),
        ack_window=float("inf"),  # only executors commit: every group is a refill
    )
    stats = worker.run()
    assert stats.succeeded == jobs
    assert sum(worker.groups) == jobs
    # Twelve held at most (4 + 8): near twelve acks a group, never mostly ones.
    assert jobs / len(worker.groups) >= 6, worker.groups


def test_a_job_queued_behind_a_long_one_starts_on_a_sleeping_executor_after_quick_jobs(
    app_factory: AppFactory,
) -> None:
    """After a stream of quick jobs the executors not needed for them sleep, and a batch
    is left to the awake one (``_hand_out``): when one of its jobs then runs long, the
    next queued job is still started at once on a sleeping executor, not after it. Here
    the two jobs can only finish together (a barrier)."""
    app = app_factory()
    barrier = threading.Barrier(2, timeout=10)
    started: dict[str, float] = {}

    @app.job("quick")
    def quick(ctx: replayq.Context, n: int) -> None:
        return None

    @app.job("meet")
    def meet(ctx: replayq.Context, side: str) -> None:
        started[side] = time.monotonic()
        barrier.wait()  # BrokenBarrierError after 10 s: the other side never started

    quick_ids = [app.enqueue("quick", {"n": n}) for n in range(48)]
    sides = [app.enqueue("meet", {"side": side}) for side in ("left", "right")]
    worker = replayq.Worker(
        app, burst=True, concurrency=4, prefetch=8, prefetch_window=float("inf")
    )
    stats = worker.run()
    assert stats.succeeded == len(quick_ids) + 2, stats
    assert all(app.get_job(i).state is replayq.JobState.SUCCEEDED for i in sides)
    assert abs(started["left"] - started["right"]) < 1.0, started


def test_a_group_the_ack_window_commits_leases_the_slots_it_frees(
    app_factory: AppFactory,
) -> None:
    """The acks thread's group commit (an executor went on to a long job) also leases the
    slots its acks free, in the same transaction: not left to a later lease of its own
    (here the dispatcher polls only every 30 s)."""
    app = app_factory()
    started, release = _quick_and_held_types(app)

    quick_id = app.enqueue("quick", {})
    held = app.enqueue("hold", {})
    later = app.enqueue("quick", {})
    # One executor and one job ahead: quick and hold are leased; quick's ack waits while
    # the executor runs hold, and its window's group frees quick's slot for ``later``.
    worker = replayq.Worker(
        app, prefetch=1, prefetch_window=float("inf"), ack_window=0.05, poll_interval=30
    )
    with _running_until_released(worker, started, release):
        wait_for(
            lambda: app.get_job(later).state is replayq.JobState.RUNNING,
            timeout=5,
            what="the slot freed by the window's group to be leased again",
        )
        assert app.get_job(quick_id).state is replayq.JobState.SUCCEEDED
        assert app.get_job(held).state is replayq.JobState.RUNNING


def _quick_and_held_types(app: replayq.App) -> tuple[threading.Event, threading.Event]:
    """Job types ``quick`` (returns at once) and ``hold`` (sets the first event when it
    starts, then waits for the test to set the second)."""
    started, release = threading.Event(), threading.Event()

    @app.job("quick")
    def quick(ctx: replayq.Context) -> None:
        return None

    @app.job("hold", lease="30s")
    def hold(ctx: replayq.Context) -> None:
        started.set()
        assert release.wait(30), "the test never let the handler finish"

    return started, release


@contextmanager
def _running_until_released(
    worker: replayq.Worker, started: threading.Event, release: threading.Event
) -> Iterator[None]:
    """``worker`` running on a thread from the moment the ``hold`` job started; on the way
    out the job is released and the worker stopped."""
    runner = threading.Thread(target=worker.run, name="worker")
    runner.start()
    try:
        assert started.wait(30), "the long job never started"
        yield
    finally:
        release.set()
        worker.stop()
        runner.join(30)
