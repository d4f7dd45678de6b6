"""Retention in tiers and gc (issue 16, items 1 and 2), on both backends.

Jobs are recorded over three days on an injected clock; gc with a 1-day full tier
trims the older ones to their ledger (lifecycle, effects, state writes) and leaves
the rest untouched: the fresh, the kept, the running, and one a live fork uses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

import replayq
import replayq.testing
from replayq.queue.retention import in_ledger
from replayq.replay.engine import fork
from replayq.worker import Worker
from tests.apps import retained
from tests.replay_support import REPLAYQ, ROOT, cli_ok

AppFactory = Callable[..., replayq.App]
DAY = 86_400.0
START = 1_700_000_000.0
RETAINED_SPEC = "tests.apps.retained:app"


def make_app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    return retained.declare(app_factory(clock=clock, retention=retained.RETENTION))


def ledger_of(events: list[replayq.TraceEvent]) -> list[tuple[object, ...]]:
    """What the ledger tier keeps of a trace, compared without event ids (a pack rewritten
    renumbers its events)."""
    return [(e.name, e.hlc, e.resource, e.status, e.attempt) for e in events if in_ledger(e)]


def shape(events: list[replayq.TraceEvent]) -> list[tuple[object, ...]]:
    return [(e.name, e.hlc, e.resource, e.status, e.attempt) for e in events]


def test_gc_trims_old_jobs_to_their_ledger_and_spares_kept_running_forked_and_fresh(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(START)
    app = make_app(app_factory, clock)
    old = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    kept = replayq.testing.run_inline(app, "credit", {"account": "b", "amount": 2})
    forked = replayq.testing.run_inline(app, "credit", {"account": "c", "amount": 3})
    running_id = app.enqueue("credit", {"account": "d", "amount": 4})
    worker = Worker(app, worker_id="held")
    try:
        (running,) = worker.lease(1)
    finally:
        worker.event_loop.close()
    clock.advance(DAY + 60)
    middle = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 5})
    clock.advance(DAY + 60)
    fresh = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 6})
    app.keep(kept.id, "incident 42")
    # A fork made now: the job it came from is still in use.
    fork(app, forked.id, from_step="credit")
    before = {job.id: app.trace(job.id) for job in (old, kept, forked, middle, fresh)}
    before[running_id] = app.trace(running_id)
    history_before = app.state.history("account", "a")
    effects_before = {e.key for e in app.effects(limit=1000)}
    assert any(not in_ledger(e) for e in before[old.id]), "the handler leaves detail to trim"

    dry = app.gc(dry_run=True)
    assert {job.id: app.trace(job.id) for job in (old, middle)} == {
        old.id: before[old.id],
        middle.id: before[middle.id],
    }, "a dry run changes nothing"
    report = app.gc()

    assert (dry.trimmed_jobs, dry.events_removed) == (report.trimmed_jobs, report.events_removed)
    assert report.trimmed_jobs == 2  # old and middle; the others are spared
    for job in (old, middle):
        after = app.trace(job.id)
        assert shape(after) == ledger_of(before[job.id])
        names = {e.name for e in after}
        assert {"job.succeeded", "state.write", "effect.succeeded"} <= names
        assert "state.read" not in names
    for job_id in (kept.id, forked.id, fresh.id, running_id):
        assert app.trace(job_id) == before[job_id], f"job {job_id} lost events"
    assert app.get_job(running.id).state is replayq.JobState.RUNNING
    # "Did it happen, how often, who wrote what" still answers.
    assert app.state.history("account", "a") == history_before
    assert {e.key for e in app.effects(limit=1000)} == effects_before
    writes = [e for e in app.resource_trace("account:a") if e.name == "state.write"]
    assert {e.job_id for e in writes} == {old.id, middle.id, fresh.id}
    assert str(old.id) in cli_ok(app.url, "trace", "show", str(old.id)).stdout
    assert "state.write" in cli_ok(app.url, "trace", "resource", "account:a").stdout
    assert str(old.id) in cli_ok(app.url, "state", "history", "account", "a").stdout
    assert f"notify:a:{old.id}" in cli_ok(app.url, "effects", "list").stdout
    again = app.gc()
    assert again.events_removed == 0, "a second pass finds nothing more"


def test_ledger_tier_end_deletes_the_job(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, ledger_days=2))
    )
    gone = replayq.testing.run_inline(
        app, "credit", {"account": "a", "amount": 1}, message_id="msg-1"
    )
    assert app.enqueue("credit", {"account": "a", "amount": 1}, message_id="msg-1") == gone.id
    clock.advance(DAY + 60)
    trimmed = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 2})
    clock.advance(DAY + 60)

    report = app.gc()

    assert (report.purged_jobs, report.trimmed_jobs) == (1, 1)
    with pytest.raises(replayq.ReplayqError):
        app.get_job(gone.id)
    assert app.trace(gone.id) == []
    assert {e.name for e in app.trace(trimmed.id)} >= {"job.succeeded", "state.write"}
    # State versions outlive the job that wrote them.
    assert len(app.state.history("account", "a")) == 2
    # What remains of it: a count in its hour (the aggregates tier).
    (hour,) = app.job_hours("credit")
    assert (hour.state, hour.jobs, hour.attempts) == ("succeeded", 1, 1)
    assert hour.hour <= START < hour.hour + 3600
    # Its message id went with the job: the same message is a new job now.
    assert app.enqueue("credit", {"account": "a", "amount": 1}, message_id="msg-1") != gone.id


def test_gc_walks_past_a_stretch_of_ids_with_nothing_to_collect(app_factory: AppFactory) -> None:
    """gc reads a window of ids at a time (a plan by the primary key's range): a window
    with no candidate (here, jobs still waiting) does not end the pass early."""
    clock = replayq.FrozenClock(START)
    app = make_app(app_factory, clock)
    waiting = [
        app.enqueue("credit", {"account": f"w{n}", "amount": n}, delay="3d") for n in range(20)
    ]
    old = [
        replayq.testing.run_inline(app, "credit", {"account": f"o{n}", "amount": n})
        for n in range(3)
    ]
    assert min(job.id for job in old) > 16, "the first two windows of 8 ids hold none of them"
    clock.advance(DAY + 60)

    report = app.gc(batch=1)

    assert report.complete and report.trimmed_jobs == 3
    assert all(all(in_ledger(e) for e in app.trace(job.id)) for job in old)
    assert all(app.get_job(job_id).state == replayq.JobState.QUEUED for job_id in waiting)


def test_idempotency_records_are_forgotten_after_their_own_retention(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, idempotency_days=2))
    )
    old = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    clock.advance(DAY + 60)
    younger = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 2})
    clock.advance(DAY + 60)

    report = app.gc()

    assert report.idempotency_jobs == 1
    keys = {e.key for e in app.effects(limit=100)}
    assert keys == {f"notify:a:{younger.id}"}
    assert {e.name for e in app.trace(old.id)} >= {"job.succeeded", "effect.succeeded"}


def test_a_gc_killed_midway_resumes_and_ends_with_the_same_result(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(time.time() - 3 * DAY)
    app = make_app(app_factory, clock)
    jobs = [
        replayq.testing.run_inline(app, "credit", {"account": f"k{n}", "amount": n})
        for n in range(12)
    ]
    before = {job.id: app.trace(job.id) for job in jobs}
    env = {**os.environ, "REPLAYQ_DB": app.url}
    command = [REPLAYQ, "--db", app.url, "gc", "--app", RETAINED_SPEC, "--batch", "1"]
    slow = subprocess.Popen(
        [*command, "--pause", "0.5"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(shape(app.trace(j.id)) != shape(before[j.id]) for j in jobs[2:]):
            assert time.monotonic() < deadline, "gc made no progress"
            assert slow.poll() is None, "gc ended before it was killed"
            time.sleep(0.05)
    finally:
        os.kill(slow.pid, signal.SIGKILL)
        slow.wait()
    untouched = [j for j in jobs if shape(app.trace(j.id)) == shape(before[j.id])]
    assert untouched, "killed midway: some jobs still to do"

    finished = cli_ok(
        app.url, "gc", "--app", RETAINED_SPEC, "--batch", "1", "--pause", "0", "--json"
    )
    report = json.loads(finished.stdout)

    assert report["resumed_from"] > 0, "the second pass resumed where the first stopped"
    for job in jobs:
        assert shape(app.trace(job.id)) == ledger_of(before[job.id])


def test_gc_runs_as_a_built_in_periodic_job(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = make_app(app_factory, clock)
    app.gc_periodic("0 * * * *")
    old = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    before = app.trace(old.id)
    clock.advance(2 * DAY)

    assert [s.job_type for s in app.schedules if s.name == "replayq.gc"] == ["replayq.gc"]
    collected = replayq.testing.run_inline(app, "replayq.gc")

    assert collected.state is replayq.JobState.SUCCEEDED
    assert collected.result["trimmed_jobs"] == 1
    assert shape(app.trace(old.id)) == ledger_of(before)


def test_an_exported_regression_case_pins_its_job(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = make_app(app_factory, clock)
    exported = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    other = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 2})
    case = json.loads(
        cli_ok(app.url, "trace", "export", str(exported.id), "--app", RETAINED_SPEC).stdout
    )
    assert case["job"]["id"] == exported.id
    before = {job.id: app.trace(job.id) for job in (exported, other)}
    clock.advance(2 * DAY)

    app.gc()

    assert [k.job_id for k in app.kept()] == [exported.id]
    assert app.trace(exported.id) == before[exported.id]
    assert shape(app.trace(other.id)) == ledger_of(before[other.id])


def test_keep_and_a_dry_run_from_the_command_line(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(time.time() - 3 * DAY)
    app = make_app(app_factory, clock)
    kept = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    other = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 2})
    before = {job.id: app.trace(job.id) for job in (kept, other)}

    said = cli_ok(app.url, "keep", str(kept.id), "--reason", "incident 7").stdout
    dry = cli_ok(app.url, "gc", "--app", RETAINED_SPEC, "--dry-run").stdout

    assert f"job {kept.id} kept: incident 7" in said
    assert [(k.job_id, k.reason) for k in app.kept()] == [(kept.id, "incident 7")]
    assert "would trim 1 to the ledger" in dry
    assert {job.id: app.trace(job.id) for job in (kept, other)} == before
