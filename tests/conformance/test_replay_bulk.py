"""Bulk dry-run in worker processes: fresh interpreters, their own connections, still sealed.

``dry_run_many(..., processes=2, app=SPEC)`` starts two ``python -m
replayq.replay.worker_process`` interpreters that import the application, open
the test's database and dry-run batches of jobs. The reports must be the ones a
dry-run in this process gives; the handlers that reach the world without ``ctx``
(``tests.apps.leaky``) must be refused there as they are here; and the reports must
really come from other processes (a handler that decides its process id).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import replayq
from replayq.replay.bulk import close_workers
from replayq.replay.engine import ReplayReport, dry_run, dry_run_many
from replayq.storage.context_params import LineageQuery
from replayq.storage.protocol import TraceQuery
from replayq.testing import run_inline
from tests.apps import leaky, replay_shop
from tests.context_support import count_rows, declare_profile_jobs, query
from tests.replay_support import APP_SPEC, derived_events, record
from tests.services import Service

AppFactory = Callable[..., replayq.App]
LEAKY_SPEC = "tests.apps.leaky:app"


def decide_process(ctx: replayq.Context, order_id: int, shipping: str = "standard") -> None:
    """A stand-in ``ship_order`` (``--handler``): decides which process runs it."""
    with ctx.step("load_order"):
        ctx.decide("process", os.getpid())


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return leaky.declare(replay_shop.declare(app_factory()))


def test_worker_processes_report_what_a_dry_run_here_reports(
    app: replayq.App, service: Service
) -> None:
    jobs = [record(app, order_id) for order_id in (1, 2, 3, 4, 5)]
    ids = [j.id for j in jobs]
    before = service.counts()
    done: list[int] = []

    apart = dry_run_many(
        app, ids, version="v2", keep=False, processes=2, app=APP_SPEC, progress=done.append
    )
    here = [dry_run(app, job_id, version="v2", keep=False) for job_id in ids]

    assert service.counts() == before, "a bulk dry-run made real requests"
    assert [r.job_id for r in apart] == ids
    assert sum(done) == len(ids)
    for far, near in zip(apart, here, strict=True):
        assert far.diverged and near.diverged
        assert far.first_divergence == near.first_divergence
        assert far.decisions == near.decisions
        assert far.outcome_now == near.outcome_now
        assert far.to_dict() | {"trace_id": "", "branch": ""} == near.to_dict() | {
            "trace_id": "",
            "branch": "",
        }


def test_the_reports_come_from_other_processes(app: replayq.App, service: Service) -> None:
    ids = [record(app, order_id).id for order_id in (1, 2, 3, 4)]
    handler = f"{__name__}:decide_process"

    reports = dry_run_many(app, ids, handler=handler, keep=False, processes=2, app=APP_SPEC)

    pids = {r.decisions[0]["now"][0] for r in reports}
    assert len(pids) == 2, reports[0].decisions
    assert os.getpid() not in pids


def test_the_worker_processes_stay_up_for_the_next_call_and_take_its_options(
    app: replayq.App, service: Service
) -> None:
    ids = [record(app, order_id).id for order_id in (1, 2, 3, 4)]
    handler = f"{__name__}:decide_process"

    first = dry_run_many(app, ids, handler=handler, keep=False, processes=2, app=APP_SPEC)
    second = dry_run_many(app, ids, handler=handler, keep=False, processes=2, app=APP_SPEC)
    plain = dry_run_many(app, ids, keep=False, processes=2, app=APP_SPEC)
    close_workers()
    after = dry_run_many(app, ids, handler=handler, keep=False, processes=2, app=APP_SPEC)
    close_workers()

    def pids(reports: list[ReplayReport]) -> set[int]:
        return {r.decisions[0]["now"][0] for r in reports}

    assert len(pids(first)) == 2
    assert pids(second) == pids(first), "the second call ran in the same worker processes"
    assert all(not r.decisions for r in plain), "each call's options reach the workers"
    assert not pids(after) & pids(first), "closed workers are replaced by new processes"


def test_kept_dry_runs_in_worker_processes_write_their_traces(
    app: replayq.App, service: Service
) -> None:
    ids = [record(app, order_id).id for order_id in (1, 2, 3)]

    reports = dry_run_many(app, ids, processes=2, app=APP_SPEC)

    assert not any(r.diverged for r in reports), [r.to_dict() for r in reports]
    with app.storage.transaction(readonly=True) as tx:
        for report in reports:
            names = [e.name for e in tx.trace_query(TraceQuery(trace_id=report.trace_id))]
            assert "replay.finished" in names and "decision" in names, names
            assert tx.lineage_list(LineageQuery(trace_id=report.trace_id))


def run_leaky(app: replayq.App, job_type: str, payload: dict[str, Any]) -> int:
    job = run_inline(app, job_type, payload)
    assert job.state == replayq.JobState.SUCCEEDED, job.last_error
    return job.id


def test_the_seal_holds_in_worker_processes(
    app: replayq.App, service: Service, tmp_path: Path
) -> None:
    marker, written = tmp_path / "marker", tmp_path / "written.txt"
    ids = [
        run_leaky(app, "leaky_http", {"sku": "sku-1"}),
        run_leaky(app, "leaky_subprocess", {"marker": str(marker)}),
        run_leaky(app, "leaky_file", {"path": str(written)}),
    ]
    marker.unlink()
    written.unlink()
    before = service.counts()

    reports = dry_run_many(app, ids, processes=2, app=LEAKY_SPEC)

    assert service.counts() == before, "a worker process reached the service"
    assert not marker.exists(), "a worker process ran the subprocess"
    assert not written.exists(), "a worker process wrote the file"
    assert [r.first_divergence.step if r.first_divergence else None for r in reports] == [
        "charge",
        "notify",
        "write",
    ]
    assert all(r.diverged and len(r.unrecorded_io) == 1 for r in reports)
    assert "socket.connect" in reports[0].unrecorded_io[0]


def test_a_job_that_cannot_be_replayed_is_passed_to_on_error_or_raised(
    app: replayq.App, service: Service
) -> None:
    ids = [record(app, 1).id, 999_999, record(app, 2).id]
    skipped: list[tuple[int, str]] = []

    for processes in (1, 2):
        skipped.clear()
        reports = dry_run_many(
            app,
            ids,
            keep=False,
            processes=processes,
            app=APP_SPEC,
            on_error=lambda job_id, error: skipped.append((job_id, str(error))),
        )
        assert [r.job_id for r in reports] == [ids[0], ids[2]]
        assert skipped == [(999_999, "no job with id 999999")]
        with pytest.raises(replayq.ReplayqError, match="no job with id 999999"):
            dry_run_many(app, ids, keep=False, processes=processes, app=APP_SPEC)


TABLES = [
    "rq_jobs",
    "rq_events",
    "rq_blobs",
    "rq_entity_versions",
    "rq_entities",
    "rq_branches",
    "rq_locks",
    "rq_idempotency",
    "rq_cache",
    "rq_outbox",
    "rq_lineage",
    "rq_steps",
]


def row_counts(url: str) -> dict[str, int]:
    return {table: count_rows(url, table) for table in TABLES}


def test_what_a_dry_run_writes_with_and_without_keep(app: replayq.App, service: Service) -> None:
    ids = [record(app, order_id).id for order_id in (1, 2)]
    before = row_counts(app.url)

    for report in [dry_run(app, ids[0], keep=False), *dry_run_many(app, ids, keep=False)]:
        assert not report.diverged, report.to_dict()
    unkept = row_counts(app.url)
    kept = dry_run_many(app, ids)
    after = row_counts(app.url)

    assert unkept == before, "a dry-run without keep wrote rows"
    changed = {t: after[t] - before[t] for t in TABLES if after[t] != before[t]}
    # Per kept dry-run: its events (+ replay.finished), a branch, a lineage row, and the
    # order's new version on the branch (head and version); nothing else.
    events = sum(len(derived_events(app, r.trace_id)) for r in kept)
    assert changed == {
        "rq_events": events,
        "rq_branches": 2,
        "rq_lineage": 2,
        "rq_entity_versions": 2,
        "rq_entities": 2,
    }, changed


def test_a_dry_runs_cache_writes_wait_for_its_final_write_or_never_happen(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    declare_profile_jobs(app)
    app.state.put("user", 7, {"name": "Ada"}, expected_version=0)
    job = run_inline(app, "render_profile", {"user_id": 7})
    cached = count_rows(app.url, "rq_cache")

    unkept = dry_run_many(app, [job.id, job.id], keep=False)
    after_unkept = count_rows(app.url, "rq_cache")
    kept = dry_run(app, job.id)

    assert not any(r.diverged for r in [*unkept, kept])
    assert after_unkept == cached, "a dry-run without keep wrote the cache"
    keys = [key for (key,) in query(app.url, "SELECT key FROM rq_cache ORDER BY key")]
    assert len(keys) == cached + 1
    assert [k for k in keys if kept.branch in k], keys


def unreachable_after(run: Callable[[], object]) -> int:
    """Objects that only the cyclic collector could free after ``run()`` (its garbage)."""
    gc.collect()
    gc.disable()
    try:
        result = run()
        del result
        return gc.collect()
    finally:
        gc.enable()


def test_a_finished_dry_run_is_freed_at_once_without_the_cycle_collector(
    app: replayq.App, service: Service
) -> None:
    """A verifier that dry-runs thousands of jobs holds only the reports it keeps: each run's
    context, recording and comparison go when it ends, not at the next collection."""
    ids = [record(app, order_id).id for order_id in (1, 2, 3)]
    dry_run(app, ids[0], keep=False)  # first use: imports, statement caches

    assert unreachable_after(lambda: dry_run(app, ids[0], keep=False)) == 0
    assert unreachable_after(lambda: dry_run(app, ids[0])) == 0
    assert unreachable_after(lambda: dry_run_many(app, ids, keep=False)) == 0
    assert unreachable_after(lambda: dry_run_many(app, ids)) == 0


def test_a_bulk_dry_run_gives_the_cycle_collector_back_even_when_it_fails(
    app: replayq.App, service: Service
) -> None:
    ids = [record(app, 1).id, 999_999]

    assert len(dry_run_many(app, ids[:1], keep=False)) == 1
    assert gc.isenabled()
    with pytest.raises(replayq.ReplayqError, match="no job with id 999999"):
        dry_run_many(app, ids, keep=False)
    assert gc.isenabled()

    gc.disable()  # a caller that runs without it keeps it off
    try:
        dry_run_many(app, ids[:1], keep=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
