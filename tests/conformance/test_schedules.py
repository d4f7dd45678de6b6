"""Periodic jobs on every backend: one job per slot whichever scheduler sees it first,
missed slots by policy after an outage, and what ``schedules list`` shows."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import CliRunner

import replayq
from replayq.cli import main
from replayq.queue.scheduler import Scheduler

START = 1_700_000_040.0  # a whole minute


def noop(ctx: replayq.Context) -> None:
    return None


def declare(app: replayq.App, **options: object) -> replayq.App:
    app.periodic("* * * * * *", **options)(app.job("beat")(noop))
    return app


def test_two_schedulers_on_one_clock_enqueue_each_slot_once(
    app_factory: Callable[..., replayq.App],
) -> None:
    clock = replayq.FrozenClock(START)
    apps = [declare(app_factory(clock=clock)) for _ in range(2)]
    schedulers = [Scheduler(a.runtime, a.schedules) for a in apps]
    for scheduler in schedulers:
        scheduler.register()
    for second in range(30):
        clock.set(START + second + 0.25)
        # Both look at every slot; the later one finds the anchor moved.
        for scheduler in schedulers if second % 2 else reversed(schedulers):
            scheduler.tick()
    jobs = apps[0].list_jobs(job_type="beat", limit=1000)
    assert sorted(j.run_at for j in jobs) == [START + s for s in range(1, 30)]
    assert sum(s.enqueued for s in schedulers) == 29
    assert all(j.causation_id == "schedule:beat" for j in jobs)


def test_after_an_outage_run_all_catches_up_only_its_bound(
    app_factory: Callable[..., replayq.App],
) -> None:
    clock = replayq.FrozenClock(START)
    app = declare(app_factory(clock=clock), missed="run_all", catch_up=5, grace="0.5s")
    scheduler = Scheduler(app.runtime, app.schedules)
    scheduler.register()
    clock.set(START + 100.75)  # 100 slots passed with no scheduler, the newest is late
    scheduler.tick()
    jobs = app.list_jobs(job_type="beat", limit=1000)
    assert sorted(j.run_at for j in jobs) == [START + s for s in range(96, 101)]


def test_schedules_list_shows_the_last_slot_its_job_and_the_next_slot(
    app_factory: Callable[..., replayq.App], db_url: str
) -> None:
    clock = replayq.FrozenClock(START)
    app = declare(app_factory(clock=clock), name="heartbeat-report")
    scheduler = Scheduler(app.runtime, app.schedules)
    scheduler.register()
    clock.set(START + 1.1)
    scheduler.tick()
    (status,) = app.schedule_statuses()
    job = app.get_job(status.last_job_id or 0)
    assert (status.name, status.last_slot, job.message_id) == (
        "heartbeat-report",
        START + 1,
        "schedule:heartbeat-report:2023-11-14T22:14:01Z",
    )
    result = CliRunner().invoke(main, ["--db", db_url, "schedules", "list", "--json"])
    assert result.exit_code == 0, result.output
    (listed,) = json.loads(result.output)
    assert listed["last_job_id"] == job.id and listed["job_type"] == "beat"
    text = CliRunner().invoke(main, ["--db", db_url, "schedules", "list"]).output
    assert "heartbeat-report" in text and f"job {job.id}" in text
