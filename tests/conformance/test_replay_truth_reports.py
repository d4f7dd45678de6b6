"""Diff, timelines, listings, rollback, enqueue and lint tell the truth (issue 10, misleading
behaviours 5-10), over both backends and through the real ``replayq`` command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import replayq
from replayq.model import JobState
from replayq.recording.locks import break_lock
from replayq.replay.diff import REJECTED, diff_traces
from replayq.replay.engine import dry_run, fork
from replayq.replay.rollback import rollback
from replayq.testing import run_inline
from tests.apps import replay_truth
from tests.replay_support import cli, idempotency_status
from tests.services import Service

AppFactory = Callable[..., replayq.App]
TRUTH_APP = "tests.apps.replay_truth:app"


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_truth.declare(app_factory())


@pytest.fixture
def frozen_app(
    app_factory: AppFactory, service: Service, clock: replayq.FrozenClock
) -> replayq.App:
    return replay_truth.declare(app_factory(clock=clock))


@pytest.fixture(autouse=True)
def no_interlude() -> Iterator[None]:
    yield
    replay_truth.INTERLUDE.clear()


def run_to_end(
    app: replayq.App, clock: replayq.FrozenClock, job_type: str, payload: dict[str, Any]
) -> replayq.Job:
    """Enqueue and run a job through every retry, advancing the frozen clock past each delay."""
    app.register_contracts()
    job_id = app.enqueue(job_type, payload)
    worker = replayq.Worker(app, worker_id="w1")
    for _ in range(10):
        if app.get_job(job_id).state not in (JobState.QUEUED, JobState.RUNNING):
            break
        clock.advance(60)
        for leased in worker.lease(1):
            worker.execute(leased)
    return app.get_job(job_id)


def record_fenced(app: replayq.App) -> replayq.Job:
    """``fenced``: the lock is broken while the step's call is in flight; the write is refused."""
    replay_truth.INTERLUDE.append(lambda: break_lock(app, "stock:sku-1", reason="test"))
    job = run_inline(app, "fenced", {"sku": "sku-1"})
    replay_truth.INTERLUDE.clear()
    assert job.state == JobState.DEAD
    return job


# -- 5. diff ------------------------------------------------------------------------------------


def test_diff_of_a_job_and_its_fork_compares_the_forked_attempt_and_counts_executions(
    frozen_app: replayq.App, clock: replayq.FrozenClock, service: Service
) -> None:
    app = frozen_app
    service.fail_next("/email", times=2, status=503)
    job = run_to_end(app, clock, "text", {"order_id": 1})
    assert job.state == JobState.SUCCEEDED and job.attempt == 3
    report = fork(app, job.id, from_step="send")

    same = diff_traces(app, str(job.id), report.trace_id)
    whole = diff_traces(app, f"{job.id}@all", report.trace_id)
    first = diff_traces(app, f"{job.id}@1", report.trace_id)
    shown = cli(app.url, "diff", str(job.id), report.trace_id)

    assert report.attempt == 3
    assert "attempt 3" in same.a.label
    assert same.identical, same.to_dict()
    assert dict(same.a.effects["sms.send [sms:1]"]) == {"succeeded": 1}
    assert whole.effects == [
        {"effect": "sms.send [sms:1]", "a": {"failed": 2, "succeeded": 1}, "b": {"succeeded": 1}}
    ]
    assert first.effects == [
        {"effect": "sms.send [sms:1]", "a": {"failed": 1}, "b": {"succeeded": 1}}
    ]
    assert first.outcome["a"] == (
        "failed [dependency]: DependencyError: sms provider unavailable: HTTP 503 (retry scheduled)"
    )
    assert shown.returncode == 0, shown.stderr
    assert "sms.send [sms:1]:  a=succeeded 1  b=succeeded 1" in shown.stdout


def test_diff_shows_a_write_that_fencing_rejected_as_rejected_not_as_written(
    app: replayq.App, service: Service
) -> None:
    job = record_fenced(app)
    report = dry_run(app, job.id)

    diff = diff_traces(app, str(job.id), report.trace_id)
    shown = cli(app.url, "diff", str(job.id), report.trace_id)

    assert diff.a.writes == {} and diff.b.writes == {}
    assert diff.a.not_committed == [{"resource": "stock:sku-1", "version": 1, "why": REJECTED}]
    assert diff.b.not_committed == diff.a.not_committed, "the replay is rejected the same way"
    assert f"a: stock:sku-1@v1  {REJECTED}" in shown.stdout


def test_diff_with_an_unknown_trace_or_job_id_is_an_error_with_exit_2(
    app: replayq.App, service: Service
) -> None:
    replay_truth.seed_order(app, 1)
    job = run_inline(app, "quote", {"order_id": 1})

    unknown_trace = cli(app.url, "diff", str(job.id), "fork-0000000000000000")
    unknown_job = cli(app.url, "diff", "999999", str(job.id))

    assert unknown_trace.returncode == 2
    assert "'fork-0000000000000000' is neither a job id nor a known trace id" in (
        unknown_trace.stderr
    )
    assert unknown_trace.stdout == ""
    assert unknown_job.returncode == 2 and "no job with id 999999" in unknown_job.stderr


# -- 6. trace show ------------------------------------------------------------------------------


def test_trace_show_orders_a_rejected_step_as_it_happened_and_marks_the_write(
    app: replayq.App, service: Service
) -> None:
    job = record_fenced(app)

    lines = cli(app.url, "trace", "show", str(job.id)).stdout.splitlines()

    def index(name: str) -> int:
        return next(i for i, line in enumerate(lines) if f" {name} " in line)

    assert index("state.write") < index("state.write_rejected") < index("step.finished")
    finished = [line for line in lines if " step.finished " in line]
    assert len(finished) == 1 and " fail " in finished[0], "never 'success' before the refusal"
    [write] = [line for line in lines if " state.write " in line]
    assert REJECTED in write


# -- 7. trace resource --------------------------------------------------------------------------


def test_trace_resource_shows_production_traces_only_unless_all_origins(
    app: replayq.App, service: Service
) -> None:
    replay_truth.seed_order(app, 1)
    job = run_inline(app, "quote", {"order_id": 1})
    report = dry_run(app, job.id)

    live = app.resource_trace("order:1")
    every = app.resource_trace("order:1", all_origins=True)
    shown = cli(app.url, "trace", "resource", "order:1").stdout
    shown_all = cli(app.url, "trace", "resource", "order:1", "--all-origins").stdout

    assert live and all(e.trace_id != report.trace_id for e in live)
    assert any(e.trace_id == report.trace_id for e in every)
    assert "(replay)" not in shown and "job None" not in shown
    assert report.trace_id in shown_all


def test_trace_resource_of_a_cache_key_leads_to_the_writer_of_its_versioned_entry(
    app: replayq.App, service: Service
) -> None:
    app.state.put("product", "sku-1", {"price": 5}, expected_version=0)
    writer = run_inline(app, "price_write", {"sku": "sku-1"})
    app.state.put("product", "sku-1", {"price": 6}, expected_version=1)
    reader = run_inline(app, "price_read", {"sku": "sku-1"})

    events = app.resource_trace("price:sku-1")

    [stale] = [e for e in events if e.name == "cache.stale_read"]
    [written] = [e for e in events if e.name == "cache.write"]
    assert stale.job_id == reader.id
    assert written.job_id == writer.id and written.resource == "price:sku-1:v1"
    assert written.hlc < stale.hlc


def test_lease_expired_line_names_the_expired_owner_and_the_reaper_apart(
    frozen_app: replayq.App, clock: replayq.FrozenClock, service: Service
) -> None:
    app = frozen_app
    app.register_contracts()
    job_id = app.enqueue("text", {"order_id": 1})
    owner = replayq.Worker(app, worker_id="stalled-owner")
    reaper = replayq.Worker(app, worker_id="the-reaper")
    assert owner.lease(1)
    clock.advance(120)
    assert reaper.reap() == 1

    [line] = [
        line
        for line in cli(app.url, "trace", "show", str(job_id)).stdout.splitlines()
        if "lease.expired" in line
    ]

    assert "(stalled-owner; reaped by the-reaper)" in line


# -- reports and listings say why ---------------------------------------------------------------


def test_dead_list_shows_the_error_beside_the_reason(app: replayq.App, service: Service) -> None:
    job = record_fenced(app)

    shown = cli(app.url, "dead", "list").stdout

    [row] = [line for line in shown.splitlines() if line.strip().startswith(str(job.id))]
    assert job.dead_reason is not None and job.dead_reason in row
    assert "[concurrency] StaleFencingTokenError: write to stock:sku-1 rejected" in row


def test_state_history_shows_the_attempt_and_who_rolled_back(
    app: replayq.App, service: Service
) -> None:
    replay_truth.seed_order(app, 1)
    job = run_inline(app, "quote", {"order_id": 1})
    rollback(app, job.id)

    lines = cli(app.url, "state", "history", "quote", "1").stdout.splitlines()

    assert len(lines) == 2
    assert f"by=job {job.id} attempt 1" in lines[0]
    assert f"by=rollback of job {job.id}" in lines[1]


# -- 8. rollback --attempt N --compensate -------------------------------------------------------


def test_rollback_of_one_attempt_compensates_only_that_attempts_effects(
    frozen_app: replayq.App, clock: replayq.FrozenClock, service: Service
) -> None:
    app = frozen_app
    job = run_to_end(app, clock, "hold_stock", {"sku": "sku-1"})
    assert job.state == JobState.SUCCEEDED and job.attempt == 2
    before = service.counts().get("/warehouse/cancellations", 0)

    shown = cli(
        app.url, "rollback", str(job.id), "--attempt", "2", "--compensate", "--app", TRUTH_APP
    )

    assert shown.returncode == 0, shown.stderr
    assert "compensated effect hold:sku-1:2" in shown.stdout
    assert "hold:sku-1:1" not in shown.stdout
    assert idempotency_status(app, "hold:sku-1:2") == "compensated"
    assert idempotency_status(app, "hold:sku-1:1") == "succeeded", "attempt 1's hold is kept"
    assert service.counts()["/warehouse/cancellations"] == before + 1


# -- 9. enqueue from the CLI --------------------------------------------------------------------


def test_cli_enqueue_without_app_uses_the_stored_contract_of_the_active_version(
    app: replayq.App, service: Service
) -> None:
    app.register_contracts()

    shown = cli(app.url, "enqueue", "quote", "--payload", '{"order_id": 7}')

    assert shown.returncode == 0, shown.stderr
    job = app.get_job(int(shown.stdout))
    assert job.ordering_key == "order:7"
    assert job.idempotency_key == "quote:7"
    assert job.max_attempts == 5, "v1 (active), not v2 (candidate, 3) nor the default"


def test_cli_enqueue_without_app_refuses_a_type_with_no_stored_contract_or_a_missing_key_field(
    app: replayq.App, service: Service
) -> None:
    app.register_contracts()

    unknown = cli(app.url, "enqueue", "nobody_declares_this", "--payload", "{}")
    keyless = cli(app.url, "enqueue", "quote", "--payload", '{"other": 1}')

    assert unknown.returncode == 2
    assert "no stored contract for job type 'nobody_declares_this'" in unknown.stderr
    assert "--app" in unknown.stderr
    assert keyless.returncode == 2 and "needs payload field(s) order_id" in keyless.stderr
    assert app.list_jobs() == []


# -- 10. contract lint --------------------------------------------------------------------------


def test_lint_flags_a_lock_held_past_its_ttl_from_observed_holds(
    app: replayq.App, service: Service
) -> None:
    app.register_contracts()
    assert run_inline(app, "hold", {"sku": "a", "seconds": 0.4}).state == JobState.SUCCEEDED

    findings = {f.rule: f.message for f in app.lint("hold")}
    shown = cli(app.url, "contract", "lint", "hold", "--json")

    assert set(findings) == {"lock-held-past-ttl", "lock-ttl-below-lease"}
    assert "lock 'shelf:a' was held" in findings["lock-held-past-ttl"]
    assert "TTL 0.2s" in findings["lock-held-past-ttl"]
    assert shown.returncode == 1
    assert {f["rule"] for f in json.loads(shown.stdout)} == set(findings)


def test_lint_flags_a_ctx_lock_ttl_below_the_lease_but_not_a_hold_within_it(
    app: replayq.App, service: Service
) -> None:
    app.register_contracts()
    assert run_inline(app, "hold", {"sku": "a", "seconds": 0.0}).state == JobState.SUCCEEDED

    assert {f.rule for f in app.lint("hold")} == {"lock-ttl-below-lease"}
    assert app.lint("quote") == [], "no locks, no findings"


def test_lint_says_unchecked_not_no_findings_for_a_version_with_no_recorded_attempt(
    app: replayq.App, service: Service
) -> None:
    """Before: a version nothing had run had its lease compared with no p99 and its locks
    with no hold, and lint said "no findings", exit 0: read as "the lease is fine"."""
    app.register_contracts()

    shown = cli(app.url, "contract", "lint", "hold")
    strict = cli(app.url, "contract", "lint", "hold", "--strict")
    as_json = cli(app.url, "contract", "lint", "hold", "--json")
    strict_json = cli(app.url, "contract", "lint", "hold", "--json", "--strict")

    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "no findings\n" not in shown.stdout
    for rule in ("lease-below-p99", "lock-ttl-below-lease", "lock-held-past-ttl"):
        assert f"hold v1: unchecked {rule}: no production attempt of hold v1" in shown.stdout
    assert "3 could not be checked" in shown.stdout
    assert strict.returncode == 1
    # --json keeps its meaning (the reasons for exit 1); the unchecked rules go to stderr.
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    assert "unchecked lease-below-p99" in as_json.stderr
    assert strict_json.returncode == 1
    assert {(f["rule"], f["kind"]) for f in json.loads(strict_json.stdout)} == {
        ("lease-below-p99", "unchecked"),
        ("lock-ttl-below-lease", "unchecked"),
        ("lock-held-past-ttl", "unchecked"),
    }
    assert {f.kind for f in app.lint("hold", unchecked=True)} == {"unchecked"}
    assert app.lint("hold") == [], "the default keeps the findings only"

    assert run_inline(app, "hold", {"sku": "a", "seconds": 0.0}).state == JobState.SUCCEEDED
    ran = cli(app.url, "contract", "lint", "hold", "--strict")
    assert "unchecked" not in ran.stdout, "a recorded attempt checks every rule"
    assert [f.rule for f in app.lint("hold", unchecked=True)] == ["lock-ttl-below-lease"]


def test_lint_says_unchecked_when_a_backlog_pushes_the_versions_runs_out_of_the_lock_window(
    app: replayq.App, service: Service
) -> None:
    """Lock holds are read from the type's newest 1000 production jobs. Before: 1000 queued
    jobs made a lock held past its TTL vanish from lint, and the lock rules read as passed."""
    app.register_contracts()
    assert run_inline(app, "hold", {"sku": "a", "seconds": 0.4}).state == JobState.SUCCEEDED
    assert "lock-held-past-ttl" in {f.rule for f in app.lint("hold")}

    app.enqueue_many([replayq.EnqueueRequest("hold", {"sku": "b", "seconds": 0})] * 1000)
    shown = cli(app.url, "contract", "lint", "hold")

    assert "hold v1: unchecked lock-held-past-ttl: the last 1000 production jobs" in shown.stdout
    assert "hold v1: unchecked lock-ttl-below-lease" in shown.stdout
    assert "unchecked lease-below-p99" not in shown.stdout, "its durations are all read"
    assert cli(app.url, "contract", "lint", "hold", "--strict").returncode == 1
