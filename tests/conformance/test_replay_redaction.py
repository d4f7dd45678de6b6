"""A replay's outcome is redacted as the worker's recording is: a secret the handler's
failure quotes, or one in what it returns, never reaches a derived trace in clear, and
a failure's message never reaches the report (``--json``, a stored verification) in clear.

The worker redacts a failed attempt's message (``job.failed``, ``last_error``) with the
job type's rules (``Outcomes._fail``); a dry-run, a fork and a rerun wrote the replayed
attempt's ``Type: message`` into their ``*.finished`` event and report as it was. With a
redaction key the markers are keyed hashes, so the replayed failure's message is the
recorded one again: the outcome does not "diverge" on a secret.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import replayq
import replayq.testing
from replayq.replay.engine import dry_run, fork
from replayq.replay.rerun import rerun
from replayq.storage.protocol import TraceQuery

AppFactory = Callable[..., replayq.App]
TOKEN = "sk_live_7f3a9c2e5b8d1f4a"
KEY = "test-redaction-key-0123456789"


def _charging(app_factory: AppFactory) -> replayq.App:
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("charge", retry=replayq.Retry(max_attempts=1))
    def charge(ctx: replayq.Context, order: int) -> dict[str, str]:
        with ctx.step("load"):
            ctx.state.get("order", order)
        if order < 0:
            raise RuntimeError(f"gateway refused Authorization: Bearer {TOKEN}")
        return {"session": f"Bearer {TOKEN}"}

    return app


def _derived(app: replayq.App, trace_id: str) -> str:
    """Every event of the derived trace ``trace_id``, as JSON text."""
    with app.storage.transaction(readonly=True) as tx:
        events = tx.trace_query(TraceQuery(trace_id=trace_id))
    assert any(e.name.endswith(".finished") for e in events), [e.name for e in events]
    return json.dumps([{"name": e.name, "data": e.data} for e in events])


def test_a_replayed_failure_quoting_a_secret_is_redacted_in_trace_and_report(
    app_factory: AppFactory,
) -> None:
    app = _charging(app_factory)
    job = replayq.testing.run_inline(app, "charge", {"order": -1})
    assert job.state is replayq.JobState.DEAD, job.state
    recorded = job.last_error or ""
    assert "Bearer [redacted:" in recorded and TOKEN not in recorded, recorded

    report = dry_run(app, job.id)
    forked = fork(app, job.id, from_step="load")
    again = rerun(app, job.id, allow_effects=["none"])

    for trace_id in (report.trace_id, forked.trace_id, again.trace_id):
        derived = _derived(app, trace_id)
        assert TOKEN not in derived and "Bearer [redacted:" in derived, derived
    for made in (report, forked):
        assert made.outcome_now.error == recorded, made.outcome_now
        text = json.dumps(made.to_dict())
        assert TOKEN not in text, text
        # Equal secrets, equal markers: the replayed failure is the recorded one.
        assert made.outcome_divergence is None and not made.diverged, made.to_dict()
    assert again.outcome.error == recorded, again.outcome


def test_a_replayed_result_holding_a_secret_is_redacted_in_the_derived_trace(
    app_factory: AppFactory,
) -> None:
    """Every domain event's data is redacted before it is stored, a ``*.finished`` event's
    outcome too. (The result in the job row, and in the report, is the application's
    value, as it was returned.)"""
    app = _charging(app_factory)
    job = replayq.testing.run_inline(app, "charge", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error

    for trace_id in (
        dry_run(app, job.id).trace_id,
        fork(app, job.id, from_step="load").trace_id,
        rerun(app, job.id, allow_effects=["none"]).trace_id,
    ):
        derived = _derived(app, trace_id)
        assert TOKEN not in derived and "Bearer [redacted:" in derived, derived


def test_a_refused_subprocess_quoting_a_secret_is_redacted_in_the_report(
    app_factory: AppFactory,
) -> None:
    """The seal's refusal names the call and its arguments: in the report (its unrecorded
    I/O, its first divergence and the failure it became) redacted, as in its
    ``io.unrecorded`` event."""
    app = app_factory(redaction=replayq.Redaction(key=KEY))
    replaying: list[bool] = []

    @app.job("notify", retry=replayq.Retry(max_attempts=1))
    def notify(ctx: replayq.Context, order: int) -> None:
        with ctx.step("notify"):
            if replaying:  # live it ran nothing; replayed it shells out, unrecorded
                subprocess.run(["true", "--header", f"Authorization: Bearer {TOKEN}"])

    job = replayq.testing.run_inline(app, "notify", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    replaying.append(True)

    report = dry_run(app, job.id)

    assert report.unrecorded_io and report.first_divergence is not None, report.to_dict()
    assert report.outcome_now.status == "failed", report.outcome_now
    text = json.dumps(report.to_dict())
    assert TOKEN not in text and "Bearer [redacted:" in text, text
    derived = _derived(app, report.trace_id)
    assert TOKEN not in derived, derived


def refuses_with_pin(ctx: replayq.Context, order: int) -> None:
    """A candidate for ``--handler``: it fails as the recorded ``pin`` job did."""
    with ctx.step("check"):
        ctx.state.get("order", order)
    raise RuntimeError(f"the bank refused pin={PIN}")


PIN = "480151"


def test_a_handler_given_by_module_path_is_redacted_with_its_job_types_rules(
    app_factory: AppFactory,
) -> None:
    """``--handler module:function`` runs under the recorded job type's contract, and its
    redaction rules with it: not the app's alone."""
    app = app_factory(redaction=replayq.Redaction(key=KEY))
    app.job(
        "pin",
        retry=replayq.Retry(max_attempts=1),
        redact=replayq.Redaction(patterns=[r"pin=(\d+)"]),
    )(refuses_with_pin)
    job = replayq.testing.run_inline(app, "pin", {"order": 1})
    recorded = job.last_error or ""
    assert "pin=[redacted:" in recorded and PIN not in recorded, recorded

    report = dry_run(app, job.id, handler=f"{__name__}:refuses_with_pin")

    assert report.outcome_now.error == recorded, report.outcome_now
    assert PIN not in json.dumps(report.to_dict()) and PIN not in _derived(app, report.trace_id)
