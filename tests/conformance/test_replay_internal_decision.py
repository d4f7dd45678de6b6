"""A replay whose failure now is a constraint of replayq's own tables (``rq_*``) refusing
replayq's own write reports the worker's decision for it, ``dead: internal_error``, on
every backend: never the contract's (``dead: not_retryable`` as ``validation``, or a retry
when the contract maps ``ConstraintViolationError`` to a retried class).

The worker parks such a failure at once (``Outcomes._fail``); a dry-run or fork's
"decision now" (``replay.decision.contract_decision``) did not know that rule and reported
what the contract would do with a ``ConstraintViolationError``. The bug is stood in for
as in ``test_worker_internal_constraint.py``: an index the test adds to
``rq_entity_versions`` (one version per namespace) after the recording, so a fork's
write of the step past its fork point, into its branch, is refused by replayq's own schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import replayq
import replayq.testing
from replayq.replay.engine import fork

AppFactory = Callable[..., replayq.App]
RETRY = replayq.Retry(max_attempts=3, base="1h", cap="1h")
MAPPED = {replayq.ConstraintViolationError: "concurrency"}


@pytest.mark.parametrize("contract", [{}, {"errors": MAPPED}], ids=["default", "mapped"])
def test_a_fork_whose_write_replayqs_own_table_refuses_decides_internal_error(
    app_factory: AppFactory, contract: dict[str, Any]
) -> None:
    app = app_factory()

    @app.job("ship", retry=RETRY, **contract)
    def ship(ctx: replayq.Context, order: int) -> None:
        with ctx.step("reserve"):
            ctx.state.put("order", order, {"reserved": True})
        with ctx.step("ship"):
            ctx.state.put("shipment", order, {"shipped": True})
        raise replayq.TransientError("the carrier is down")

    job = replayq.testing.run_inline(app, "ship", {"order": 1})
    assert job.state is replayq.JobState.QUEUED, job.last_error  # retried: attempt 2 of 3
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_entity_versions_one ON rq_entity_versions (namespace)"
        )

    report = fork(app, job.id, from_step="ship")

    assert report.retry_recorded == "retry in ≤ 3600.0 s (attempt 2 of 3)", report.retry_recorded
    now = report.outcome_now
    assert (now.status, now.error_class) == ("failed", "unknown"), now
    error = now.error or ""
    assert error.startswith("internal error of replayq"), error
    assert "table rq_entity_versions" in error, error
    # What the worker would decide for it: parked, whatever the contract maps or retries.
    assert report.retry_now == "dead: internal_error", report.retry_now
    assert report.diverged


def test_a_recorded_internal_error_is_not_a_retry_decision_the_version_changed(
    app_factory: AppFactory,
) -> None:
    """The recorded decision ``dead: internal_error`` was replayq's (its own table refused
    the attempt's step), not the contract's: a verification whose replay now fails as the
    contract retries does not count a ``retry_decision`` difference (the version's retry
    policy did not change), only the outcome's."""
    from replayq.replay.engine import dry_run
    from replayq.rollout.verify import classify

    app = app_factory()
    fails_now: list[bool] = []

    @app.job("ship", retry=RETRY)
    def ship(ctx: replayq.Context, order: int) -> None:
        with ctx.step("ship"):
            ctx.state.put("shipment", order, {"shipped": True})
        if fails_now:
            raise replayq.TransientError("the carrier is down")

    first = replayq.testing.run_inline(app, "ship", {"order": 1})
    assert first.state is replayq.JobState.SUCCEEDED, first.last_error
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_entity_versions_one ON rq_entity_versions (namespace)"
        )
    job = replayq.testing.run_inline(app, "ship", {"order": 2})
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error")
    with app.storage.transaction() as tx:
        tx.connection.execute("DROP INDEX rq_entity_versions_one")  # type: ignore[attr-defined]
    fails_now.append(True)

    report = dry_run(app, job.id, keep=False)

    assert report.retry_recorded == "dead: internal_error", report.retry_recorded
    assert report.retry_now == "retry in ≤ 3600.0 s (attempt 2 of 3)", report.retry_now
    classes, _ = classify(report, [], [])
    assert "outcome" in classes and "retry_decision" not in classes, classes


def test_a_rerun_refused_by_replayqs_own_table_reports_it_as_the_worker_does(
    app_factory: AppFactory,
) -> None:
    """A rerun writes state for real, so it can meet the refusal a dry-run does not: its
    outcome says what the worker records for it (class ``unknown``, the message naming
    replayq's table as replayq's bug), never ``validation`` as if the job's data failed a
    check (``ConstraintViolationError``'s default class) nor the contract's mapped class."""
    from replayq.replay.rerun import rerun

    app = app_factory()
    runs: list[int] = []

    @app.job("ship", errors=MAPPED)
    def ship(ctx: replayq.Context, order: int) -> None:
        runs.append(order)
        # Outside a step (a rerun skips no completed step), a value not written before.
        ctx.state.put("shipment", order, {"shipped": len(runs)})

    job = replayq.testing.run_inline(app, "ship", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_entity_versions_one ON rq_entity_versions (namespace)"
        )

    report = rerun(app, job.id, allow_effects=["none"])

    outcome = report.outcome
    assert (outcome.status, outcome.error_class) == ("failed", "unknown"), outcome
    error = outcome.error or ""
    assert error.startswith("internal error of replayq"), error
    assert "table rq_entity_versions" in error, error


def test_a_recorded_attempt_parked_without_job_failed_reads_as_its_failure(
    app_factory: AppFactory,
) -> None:
    """An attempt whose failure's settle replayq's own tables refused is parked with its
    ``job.dead`` alone (``Outcomes._park_internal``: no ``job.failed``, no retry). A replay
    reads that as the recorded outcome: failed, class ``unknown`` and the park's message,
    decided ``dead: internal_error`` — not an attempt that "never settled". Stood in for as
    in ``test_worker_internal_constraint_fail.py``: a second job waiting for its retry is
    refused by an index the test adds to ``rq_jobs``."""
    from replayq.replay.engine import dry_run

    app = app_factory()
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_jobs_one_retry ON rq_jobs (job_type) "
            "WHERE state = 'queued' AND last_error IS NOT NULL"
        )

    @app.job("flaky", retry=RETRY, errors={ValueError: "transient"})
    def flaky(ctx: replayq.Context, order: int) -> None:
        with ctx.step("reserve"):
            ctx.state.put("order", order, {"reserved": True})
        raise ValueError("bad order")

    first = replayq.testing.run_inline(app, "flaky", {"order": 1})
    assert first.state is replayq.JobState.QUEUED, first.last_error  # its retry in an hour
    job = replayq.testing.run_inline(app, "flaky", {"order": 2})
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error")
    names = [e.name for e in app.trace(job.id)]
    assert "job.failed" not in names and "step.finished" in names, names

    report = dry_run(app, job.id, keep=False)

    recorded = report.outcome_recorded
    assert (recorded.status, recorded.error_class) == ("failed", "unknown"), recorded
    assert recorded.error == job.last_error, (recorded.error, job.last_error)
    assert (recorded.error or "").startswith("internal error of replayq"), recorded.error
    assert report.retry_recorded == "dead: internal_error", report.retry_recorded
    # Replayed, the handler fails as it did, as its contract classes it: only the outcome
    # differs (replayq's park is not the contract's decision), never "incomplete".
    assert report.outcome_now.error_class == "transient", report.outcome_now
    assert report.outcome_divergence == "recorded failure class unknown, now transient"
    assert report.retry_now == "retry in ≤ 3600.0 s (attempt 2 of 3)", report.retry_now


def test_a_kept_dry_run_whose_final_write_replayqs_own_table_refuses_reports_it(
    app_factory: AppFactory,
) -> None:
    """A kept dry-run writes its derived trace, its branch's state and its lineage in one
    transaction after the handler returned. Refused there by a constraint of replayq's own
    tables (its branch's entity versions, here), it reports the refusal as a fork reports
    it at its step's commit — failed, class ``unknown``, ``dead: internal_error``, diverged —
    with nothing of the run kept; before, the refusal was raised and the comparison lost."""
    from replayq.replay.engine import dry_run
    from replayq.storage.protocol import TraceQuery

    app = app_factory()

    @app.job("ship", retry=RETRY)
    def ship(ctx: replayq.Context, order: int) -> None:
        with ctx.step("ship"):
            ctx.state.put("shipment", order, {"shipped": True})

    job = replayq.testing.run_inline(app, "ship", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_entity_versions_one ON rq_entity_versions (namespace)"
        )

    report = dry_run(app, job.id)

    assert report.first_divergence is None, report.first_divergence  # the run compared alike
    now = report.outcome_now
    assert (now.status, now.error_class) == ("failed", "unknown"), now
    error = now.error or ""
    assert error.startswith("internal error of replayq"), error
    assert "table rq_entity_versions" in error, error
    assert "not kept" in error, error
    assert report.retry_now == "dead: internal_error", report.retry_now
    assert report.outcome_divergence == "recorded succeeded, now failed"
    assert report.diverged
    with app.storage.transaction(readonly=True) as tx:
        assert tx.trace_query(TraceQuery(trace_id=report.trace_id)) == []
    # Without keeping, nothing is written, so nothing is refused: the run is as recorded.
    assert not dry_run(app, job.id, keep=False).diverged


def test_a_bulk_dry_run_reports_the_kept_write_refused_and_keeps_the_others(
    app_factory: AppFactory,
) -> None:
    """A bulk dry-run writes a batch's kept runs in one transaction. Refused there by a
    constraint of replayq's own tables, each run's write is tried on its own: the one
    refused again reports it (as a single dry-run does), the others are kept; before, the
    refusal was raised and the whole batch lost."""
    from replayq.replay.bulk import dry_run_many
    from replayq.storage.protocol import TraceQuery

    app = app_factory()

    @app.job("put", retry=RETRY)
    def put(ctx: replayq.Context, namespace: str) -> None:
        with ctx.step("put"):
            ctx.state.put(namespace, 1, {"put": True})

    jobs = [replayq.testing.run_inline(app, "put", {"namespace": n}) for n in ("a", "b", "c")]
    assert all(job.state is replayq.JobState.SUCCEEDED for job in jobs)
    with app.storage.transaction() as tx:
        tx.connection.execute(  # type: ignore[attr-defined]
            "CREATE UNIQUE INDEX rq_entity_versions_one_b ON rq_entity_versions (namespace) "
            "WHERE namespace = 'b'"
        )

    reports = dry_run_many(app, [job.id for job in jobs], keep=True)

    assert [report.job_id for report in reports] == [job.id for job in jobs]
    refused = reports[1]
    assert (refused.outcome_now.status, refused.outcome_now.error_class) == ("failed", "unknown")
    assert "table rq_entity_versions" in (refused.outcome_now.error or "")
    assert refused.retry_now == "dead: internal_error" and refused.diverged
    with app.storage.transaction(readonly=True) as tx:
        assert tx.trace_query(TraceQuery(trace_id=refused.trace_id)) == []
        for kept in (reports[0], reports[2]):
            assert not kept.diverged, kept.to_dict()
            names = [e.name for e in tx.trace_query(TraceQuery(trace_id=kept.trace_id))]
            assert "replay.finished" in names, names
