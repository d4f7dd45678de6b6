"""A dry-run of a recording whose failure message was stored in clear, under rules that
now redact part of it (a pattern the app added since, or a recording made before replayq
redacted job errors): the replayed failure is the recorded one, no divergence.

A replay's outcome is redacted with the job type's rules of today (``failed_outcome``);
the recorded one is what the worker stored then. Compared as they were, the same
``RuntimeError`` read ``recorded error '... ACME-12345', now '... [redacted]'``: the
handler unchanged, reported as diverged, and the recorded message, secret as the rules
now say, printed in clear in the report. Both sides are compared redacted by the same
rules (a marker already in the recording is left as it is).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import replayq
import replayq.testing
from replayq.replay.engine import dry_run

AppFactory = Callable[..., replayq.App]
REF = "ACME-12345"


def _app(app_factory: AppFactory, redaction: replayq.Redaction | None) -> replayq.App:
    app = app_factory(redaction=redaction)

    @app.job("ship", retry=replayq.Retry(max_attempts=1))
    def ship(ctx: replayq.Context, order: int) -> None:
        with ctx.step("load"):
            ctx.state.get("order", order)
        raise RuntimeError(f"carrier refused account {REF}")

    return app


def test_a_failure_recorded_in_clear_dry_runs_without_divergence_under_a_new_rule(
    app_factory: AppFactory,
) -> None:
    before = _app(app_factory, None)
    job = replayq.testing.run_inline(before, "ship", {"order": 7})
    assert job.state is replayq.JobState.DEAD, job.state
    assert REF in (job.last_error or ""), job.last_error  # no rule said it was secret
    before.close()

    # The same handler; the app now says such account numbers are secret.
    after = _app(app_factory, replayq.Redaction(patterns=[r"ACME-\d+"]))
    report = dry_run(after, job.id)
    assert report.outcome_now.error == "RuntimeError: carrier refused account [redacted]"
    assert report.outcome_divergence is None and not report.diverged, report.to_dict()
    # What the report shows of the recording is redacted by the same rules.
    assert REF not in json.dumps(report.to_dict()), report.to_dict()
