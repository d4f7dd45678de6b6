"""A bulk verification's quick check (``replay.quick``): same report, fewer steps, still sealed.

``dry_run_many(..., keep=False)`` first runs each job against its recording without
building events. A job found the same as recorded gets the report a dry-run gives
(without its events); every other job — a divergence, I/O that bypassed ``ctx``, a
secret in a compared value, a verb the quick run does not implement, even if the
handler swallows the refusal — gets the full dry-run's report, unchanged. Nothing is
written, and the outside functions are never called.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.replay.engine import ReplayReport, dry_run, dry_run_many
from replayq.storage.protocol import TraceQuery
from replayq.testing import run_inline
from tests.context_support import count_rows

AppFactory = Callable[..., replayq.App]
CARD = "4111 1111 1111 1111"  # a card number (Luhn-valid): redacted when recorded
OUTSIDE: list[str] = []  # calls that reached the outside functions


def quote(order_id: int) -> dict[str, Any]:
    OUTSIDE.append("quote")
    return {"cents": 100 * order_id}


def charge(order_id: int) -> dict[str, Any]:
    OUTSIDE.append("charge")
    return {"id": f"ch-{order_id}"}


def fulfil(ctx: replayq.Context, order_id: int, *, margin: int) -> dict[str, Any]:
    with ctx.step("load"):
        order = ctx.state.get("order", order_id)
    with ctx.step("price"):
        priced = ctx.call("pricing.quote", quote, order_id)
    with ctx.step("decide"):
        ship = ctx.decide("ship", priced["cents"] > margin, cents=priced["cents"])
    with ctx.step("charge"):
        receipt = ctx.effect("payment.charge", lambda: charge(order_id), key=f"charge:{order_id}")
    with ctx.step("write"):
        stamped = ctx.now()
        ctx.state.put("order", order_id, {**(order.data or {}), "ship": ship, "at": stamped})
    return {"receipt": receipt["id"], "ship": ship}


@pytest.fixture
def app(app_factory: AppFactory) -> replayq.App:
    app = app_factory()

    @app.job("order", version="v1")
    def v1(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return fulfil(ctx, order_id, margin=250)

    @app.job("order", version="v2", candidate=True)
    def v2(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return fulfil(ctx, order_id, margin=450)  # order 3 and 4 flip ``ship``

    @app.job("order", version="leaky", candidate=True)
    def leaky(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        # Refused by the seal; the handler swallows the refusal and carries on.
        with contextlib.suppress(Exception):
            socket.create_connection(("127.0.0.1", 9), timeout=1).close()
        return fulfil(ctx, order_id, margin=250)

    @app.job("order", version="swallows", candidate=True)
    def swallows(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        result = fulfil(ctx, order_id, margin=250)
        # A lock the recording lacks (not a quick-run verb): swallowed if refused.
        with contextlib.suppress(Exception), ctx.lock(f"order:{order_id}"):
            pass
        return result

    @app.job("order", version="hides-at", candidate=True, redact=replayq.Redaction(["at"]))
    def hides_at(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return fulfil(ctx, order_id, margin=250)  # the same code, a field now secret

    @app.job("pair", version="v1")
    def pair(ctx: replayq.Context, n: int) -> None:
        with ctx.step("pick"):
            ctx.decide("pair", (n, n + 1))  # recorded as a JSON list, compared as a tuple

    @app.job("card", version="v1")
    def card(ctx: replayq.Context, n: int) -> str:
        with ctx.step("pay"):
            return str(ctx.decide("card", f"{CARD} #{n}"))

    return app


def recorded(app: replayq.App, job_type: str, payloads: list[dict[str, Any]]) -> list[int]:
    ids = []
    for payload in payloads:
        job = run_inline(app, job_type, payload)
        assert job.state == replayq.JobState.SUCCEEDED, job.last_error
        ids.append(job.id)
    return ids


def written(app: replayq.App) -> list[int]:
    """Rows of what a kept dry-run writes: traces, lineage, branches, entity versions."""
    tables = ("rq_trace", "rq_lineage", "rq_branches", "rq_entity_versions")
    return [count_rows(app.runtime.url, table) for table in tables]


def comparable(report: ReplayReport) -> str:
    """A report as JSON, without the derived trace's random names (wherever they occur)."""
    text = json.dumps(report.to_dict(), sort_keys=True, default=str)
    return text.replace(report.branch, "BRANCH").replace(report.trace_id, "TRACE")


def test_jobs_found_the_same_get_a_dry_runs_report_without_events_and_nothing_written(
    app: replayq.App,
) -> None:
    ids = recorded(app, "order", [{"order_id": n} for n in range(1, 7)])
    before = written(app)
    OUTSIDE.clear()

    reports = dry_run_many(app, ids, keep=False)

    assert [r.job_id for r in reports] == ids
    assert all(r.matched_in_memory and not r.diverged for r in reports)
    assert all(r.events_now == [] for r in reports)
    full = [dry_run(app, job_id, keep=False) for job_id in ids]
    assert [comparable(r) for r in reports] == [comparable(r) for r in full]
    assert written(app) == before, "a dry-run with keep=False wrote"
    assert OUTSIDE == []


def test_a_diverging_job_gets_the_full_dry_runs_report(app: replayq.App) -> None:
    ids = recorded(app, "order", [{"order_id": n} for n in range(1, 7)])
    OUTSIDE.clear()

    reports = dry_run_many(app, ids, version="v2", keep=False)

    full = [dry_run(app, job_id, version="v2", keep=False) for job_id in ids]
    assert [comparable(r) for r in reports] == [comparable(r) for r in full]
    flipped = [r.job_id for r in reports if r.diverged]
    assert flipped == ids[2:4]
    for report in reports:
        if report.diverged:
            assert not report.matched_in_memory
            assert report.events_now, "a diverging job's report lost its events"
            assert report.decisions == [
                {"decision": "ship", "recorded": [True], "now": [False]},
            ]
    assert OUTSIDE == []


def test_io_that_bypassed_ctx_is_still_reported_when_the_handler_swallows_it(
    app: replayq.App,
) -> None:
    ids = recorded(app, "order", [{"order_id": 1}, {"order_id": 2}])

    reports = dry_run_many(app, ids, version="leaky", keep=False)

    for report in reports:
        assert report.diverged and not report.matched_in_memory
        assert report.unrecorded_io and "127.0.0.1" in report.unrecorded_io[0]
        assert report.first_divergence is not None
    full = [dry_run(app, job_id, version="leaky", keep=False) for job_id in ids]
    assert [comparable(r) for r in reports] == [comparable(r) for r in full]


def test_a_verb_the_quick_run_lacks_is_left_to_the_full_dry_run_even_if_swallowed(
    app: replayq.App,
) -> None:
    ids = recorded(app, "order", [{"order_id": 1}])

    [report] = dry_run_many(app, ids, version="swallows", keep=False)

    # The lock the recording lacks is a divergence the full dry-run finds.
    assert report.diverged and not report.matched_in_memory
    assert report.first_divergence is not None
    assert comparable(report) == comparable(dry_run(app, ids[0], version="swallows", keep=False))


def test_a_secret_in_a_compared_value_is_compared_redacted(app: replayq.App) -> None:
    ids = recorded(app, "card", [{"n": 1}, {"n": 2}])
    with app.runtime.storage.transaction(readonly=True) as tx:
        [decision] = [e for e in tx.trace_query(TraceQuery(job_id=ids[0])) if e.name == "decision"]
    assert CARD not in str(decision.data["value"]), "the recording holds the card number"

    reports = dry_run_many(app, ids, keep=False)

    # The handler's own value (the card number) differs from the recorded (redacted) one:
    # the full dry-run redacts it before comparing, and finds the job the same.
    assert not any(r.diverged or r.matched_in_memory for r in reports)
    assert CARD not in str([r.events_now[0].data for r in reports])
    full = [dry_run(app, job_id, keep=False) for job_id in ids]
    assert [comparable(r) for r in reports] == [comparable(r) for r in full]


def test_a_value_equal_only_as_json_gets_the_full_dry_runs_verdict(app: replayq.App) -> None:
    ids = recorded(app, "pair", [{"n": 1}])

    [report] = dry_run_many(app, ids, keep=False)

    # Signatures compare JSON texts, the report's decisions compare values: the full
    # dry-run's verdict stands, whatever it is.
    assert not report.matched_in_memory
    assert comparable(report) == comparable(dry_run(app, ids[0], keep=False))


def test_a_value_the_candidates_rules_would_redact_is_not_vouched_for(app: replayq.App) -> None:
    ids = recorded(app, "order", [{"order_id": 1}, {"order_id": 2}])

    reports = dry_run_many(app, ids, version="hides-at", keep=False)

    # The handler's own values equal the recorded ones, but the full dry-run redacts the
    # new secret field ``at`` of the state write before comparing: its report says so.
    full = [dry_run(app, job_id, version="hides-at", keep=False) for job_id in ids]
    assert all(r.diverged for r in full)
    assert [comparable(r) for r in reports] == [comparable(r) for r in full]
    assert not any(r.matched_in_memory for r in reports)


def test_rollout_verify_passes_an_identical_candidate_checked_quickly(app: replayq.App) -> None:
    @app.job("order", version="v1-again", candidate=True)
    def again(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        return fulfil(ctx, order_id, margin=250)

    recorded(app, "order", [{"order_id": n} for n in range(1, 5)])

    report = replayq.verify_rollout(app, "order", from_version="v1", to_version="v1-again")

    assert report.attempts == 4
    assert report.counts == {}, report.to_dict()
    assert report.passed
    flagged = replayq.verify_rollout(app, "order", from_version="v1", to_version="v2")
    assert flagged.counts == {"decision_path": 2, "state": 2}, flagged.to_dict()


def test_a_recording_whose_handler_left_a_step_open_is_left_to_the_full_dry_run(
    app_factory: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job recorded as succeeded although its handler returned with a step left open (a
    generator suspended in it and kept: recorded so before such a return failed its
    attempt): the quick check does not vouch for it; the full dry-run's report says the
    handler now fails."""
    app = app_factory()
    kept: list[Any] = []

    @app.job("open_step", version="v1")
    def open_step(ctx: replayq.Context, n: int) -> None:
        def lines() -> Any:
            with ctx.step("gen"):
                yield n

        suspended = lines()
        next(suspended)
        kept.append(suspended)

    def close_kept() -> None:
        # Closed after their attempt's end: the step refuses (``ContextEndedError``).
        while kept:
            with contextlib.suppress(replayq.ContextEndedError):
                kept.pop().close()

    # Recorded as a release before the check would have: the return let through.
    with monkeypatch.context() as before:
        before.setattr(replayq.Context, "_refuse_step_left_open", lambda self: None)
        ids = recorded(app, "open_step", [{"n": 1}])
    close_kept()

    [report] = dry_run_many(app, ids, keep=False)
    close_kept()

    assert not report.matched_in_memory
    assert report.outcome_recorded.status == "succeeded"
    assert report.outcome_now.status == "failed"
    assert "returned inside ctx.step('gen')" in (report.outcome_now.error or "")
