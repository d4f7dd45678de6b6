"""Replay tells the truth (issue 10, misleading behaviours 1-4): recorded failures replay
with their class and message, a dry-run reports the retry decision, locks and fencing
rejections replay as recorded, and a fork never makes up an effect."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import replayq
from replayq.model import JobState
from replayq.recording.locks import break_lock
from replayq.replay.engine import dry_run, fork
from replayq.testing import run_inline
from tests.apps import replay_truth
from tests.replay_support import cli, derived_events
from tests.services import Service

AppFactory = Callable[..., replayq.App]
TRUTH_APP = "tests.apps.replay_truth:app"


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_truth.declare(app_factory())


@pytest.fixture(autouse=True)
def no_interlude() -> Iterator[None]:
    yield
    replay_truth.INTERLUDE.clear()


def record_quote(app: replayq.App, order_id: int = 1) -> replayq.Job:
    replay_truth.seed_order(app, order_id)
    return run_inline(app, "quote", {"order_id": order_id})


def test_validation_error_raised_inside_call_replays_as_validation_with_its_message(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/inventory/sku-1", status=422)
    job = record_quote(app)
    assert job.state == JobState.DEAD and job.last_error_class == "validation"
    before = service.counts()

    report = dry_run(app, job.id)
    shown = cli(app.url, "replay", str(job.id), "--mode", "dry-run", "--app", TRUTH_APP)

    assert service.counts() == before
    assert report.outcome_now.error_class == "validation"
    assert report.outcome_now.error == report.outcome_recorded.error == job.last_error
    assert report.retry_now == report.retry_recorded == "dead: not_retryable"
    assert not report.diverged, report.to_dict()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"failed [validation] {job.last_error}" in shown.stdout, "text reports say why"
    [call] = [e for e in derived_events(app, report.trace_id) if e.name == "call"]
    assert call.data["error_class"] == "validation"


def test_dependency_error_inside_call_replays_as_dependency_with_the_same_retry_decision(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/inventory/sku-1", status=503)
    job = record_quote(app)
    # Attempt 1 failed and was given a retry. Its jittered delay (≤ 1 s) can be a few
    # milliseconds, and run_inline runs a retry that is already due, so the job itself may
    # be queued or already succeeded by attempt 2: what is asserted is attempt 1's record.
    [failed, *_] = [e for e in app.trace(job.id) if e.name == "job.failed"]
    assert failed.attempt == 1 and failed.data["error_class"] == "dependency"

    report = dry_run(app, job.id, attempt=1)

    assert report.outcome_now.error_class == "dependency"
    assert report.retry_recorded == "retry in ≤ 1.0 s (attempt 2 of 5)"
    assert report.retry_now == report.retry_recorded
    assert not report.diverged, report.to_dict()


def test_a_version_that_changes_the_failure_class_is_a_divergence(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/inventory/sku-1", status=422)
    job = record_quote(app)

    report = dry_run(app, job.id, version="v3")
    shown = cli(
        app.url, "replay", str(job.id), "--mode", "dry-run", "--version", "v3", "--app", TRUTH_APP
    )

    assert report.outcome_now.error_class == "dependency"
    assert report.outcome_divergence == "recorded failure class validation, now dependency"
    assert report.diverged
    assert shown.returncode == 1
    assert "OUTCOME DIVERGES: recorded failure class validation, now dependency" in shown.stdout
    assert "no divergence" not in shown.stdout


def test_a_version_whose_retry_policy_changed_reports_the_other_decision_as_divergence(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/inventory/sku-1", status=503)
    job = record_quote(app)

    report = dry_run(app, job.id, attempt=1, version="v2")
    # Attempt 1 named here too: its retry is due within a second, and on a loaded machine
    # run_inline may already have run attempt 2 (which succeeds) before it returned.
    shown = cli(
        app.url,
        "replay",
        str(job.id),
        "--mode",
        "dry-run",
        "--attempt",
        "1",
        "--version",
        "v2",
        "--app",
        TRUTH_APP,
    )

    assert report.first_divergence is None, "the same events: only the decision differs"
    assert report.retry_recorded == "retry in ≤ 1.0 s (attempt 2 of 5)"
    assert report.retry_now == "dead: not_retryable"
    assert report.diverged
    assert shown.returncode == 1
    assert "decision recorded: retry in ≤ 1.0 s (attempt 2 of 5)" in shown.stdout
    assert "decision now:      dead: not_retryable" in shown.stdout


def test_fencing_rejection_and_expired_lock_replay_as_recorded(
    app: replayq.App, service: Service
) -> None:
    replay_truth.INTERLUDE.append(lambda: break_lock(app, "stock:sku-1", reason="test"))
    job = run_inline(app, "fenced", {"sku": "sku-1"})
    assert job.state == JobState.DEAD and job.last_error_class == "concurrency"
    replay_truth.INTERLUDE.clear()
    recorded = [e.name for e in app.trace(job.id) if e.kind == "domain"]
    assert "state.write_rejected" in recorded and "lock.expired" in recorded

    report = dry_run(app, job.id)

    now = derived_events(app, report.trace_id)
    names = [e.name for e in now]
    assert "state.write_rejected" in names, "the write is rejected again, not 'now succeeds'"
    assert "lock.expired" in names
    [acquired] = [e for e in now if e.name == "lock.acquired"]
    [original] = [e for e in app.trace(job.id) if e.name == "lock.acquired"]
    assert acquired.data["fencing_token"] == original.data["fencing_token"]
    assert report.outcome_now.error_class == "concurrency"
    assert report.outcome_now.error == job.last_error
    assert not report.diverged, report.to_dict()
    assert not app.state.get("stock", "sku-1").exists, "nothing was written in production"


def test_fork_onto_an_effect_the_recording_lacks_is_a_clear_divergence_unless_stubbed(
    app: replayq.App, service: Service
) -> None:
    job = record_quote(app)
    assert job.state == JobState.SUCCEEDED
    before = service.counts()

    report = fork(app, job.id, from_step="notify", version="v4")
    stubbed = fork(
        app, job.id, from_step="notify", version="v4", stubs={"email.send": {"id": "stub"}}
    )

    assert service.counts() == before
    assert report.outcome_now.status == "failed"
    assert report.error is not None
    assert "effect not in the recording: stub it with --stub" in report.error
    assert "rerun --allow-effects email.send" in report.error
    assert report.diverged
    assert stubbed.outcome_now.status == "succeeded"
    [replayed] = [
        e
        for e in derived_events(app, stubbed.trace_id)
        if e.name == "effect.replayed" and e.data["kind"] == "email.send"
    ]
    assert replayed.data["result"] == {"id": "stub"}


def test_fork_past_a_recorded_failed_effect_replays_the_failure(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email", status=503)
    job = record_quote(app)
    assert job.state == JobState.DEAD, "the text failed with an unclassified HTTPError"
    before = service.counts()

    report = fork(app, job.id, from_step="notify", attempt=1)

    assert service.counts() == before
    assert report.outcome_now.status == "failed", "not None handed to the new code"
    assert report.outcome_now.error == report.outcome_recorded.error
    assert report.outcome_now.error_class == report.outcome_recorded.error_class
    assert not report.diverged, report.to_dict()


def test_rerun_text_report_prints_the_failure_class_and_message(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/inventory/sku-1", status=422)
    job = record_quote(app)
    service.fail_next("/inventory/sku-1", status=422)

    shown = cli(
        app.url, "rerun", str(job.id), "--app", TRUTH_APP, "--allow-effects", "sms.send", "--yes"
    )

    assert shown.returncode == 0, shown.stderr
    assert "failed [validation] ValidationError: inventory refused sku-1: HTTP 422" in shown.stdout
