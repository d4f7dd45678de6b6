"""Trace replay and deterministic dry-run: the handler runs again, the real world is never touched.

The service the handler calls is a real HTTP server in another process; its
request counters are the proof that a replay made no real call.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from replayq.replay.engine import dry_run, fork, trace_replay
from replayq.replay.recorded import Outcome
from replayq.storage.protocol import TraceQuery
from replayq.testing import run_inline
from tests.apps import replay_shop
from tests.replay_support import APP_SPEC, cli, cli_ok, derived_events, record, record_dead
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_shop.declare(app_factory())


def test_recording_reached_the_real_service(app: replayq.App, service: Service) -> None:
    job = record(app)

    assert service.counts() == {"/inventory/sku-1": 1, "/warehouse/shipments": 1, "/email": 1}
    assert job.result == {"status": "shipped", "shipment_id": "shp-1"}


def test_dry_run_of_unchanged_code_matches_and_makes_zero_real_calls(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    report = dry_run(app, job.id)
    forked = fork(app, job.id, from_step="apply")
    timelines = trace_replay(app, job.id)

    assert service.counts() == before, "dry-run, fork and trace replay made real requests"
    assert not report.diverged, report.to_dict()
    assert report.first_divergence is None
    assert report.error is None
    assert report.outcome_now == Outcome("succeeded", result=job.result)
    assert not forked.diverged, forked.to_dict()
    # The handler really ran again: its answers came from the recording.
    replayed = derived_events(app, report.trace_id)
    assert [e.data["call"] for e in replayed if e.name == "call"] == ["inventory.get"]
    assert [e.data["kind"] for e in replayed if e.name == "effect.replayed"] == [
        "warehouse.ship",
        "email.send",
    ]
    assert [t.attempt for t in timelines] == [0, 1]
    assert timelines[1].side_effect_steps == ["apply", "notify"]


def test_trace_replay_through_the_cli_shows_the_timeline_and_calls_nothing(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    shown = cli_ok(app.url, "replay", str(job.id), "--mode", "trace").stdout
    unchanged = cli(app.url, "replay", str(job.id), "--mode", "dry-run", "--app", APP_SPEC)

    assert service.counts() == before
    assert "== attempt 1 (worker inline; real side effects in: apply, notify)" in shown
    assert "decision=ship value=True" in shown
    assert "lock.acquired" in shown and "fencing_token=1" in shown
    assert "order:1@v1" in shown, "the state version the attempt read"
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "no divergence" in unchanged.stdout


def test_flipped_decision_is_reported_at_its_step_and_sequence_number(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    [recorded_decision] = [e for e in app.trace(job.id) if e.name == "decision"]
    before = service.counts()

    report = dry_run(app, job.id, version="v2")

    assert service.counts() == before
    assert report.diverged
    where = report.first_divergence
    assert where is not None
    assert where.step == "decide"
    assert where.recorded_seq == recorded_decision.seq
    assert where.recorded is not None and where.now is not None
    assert where.recorded["name"] == where.now["name"] == "decision"
    assert where.recorded["data"]["value"] is True
    assert where.now["data"]["value"] is False
    assert where.recorded["data"]["why"]["margin"] == 0
    assert where.now["data"]["why"]["margin"] == 10
    assert report.decisions == [{"decision": "ship", "recorded": [True], "now": [False]}]
    [write] = report.state_writes
    assert write["resource"] == "order:1"
    assert write["recorded"][0]["set"]["status"] == "shipped"
    assert write["now"][0]["set"]["status"] == "backordered"
    # v2 then asks for an email the recording never sent: the run stops there, denied.
    assert report.outcome_now.status == "failed"
    assert report.error is not None and "email.send" in report.error


def test_cli_dry_run_of_a_changed_version_exits_1_and_prints_the_divergence(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    [recorded_decision] = [e for e in app.trace(job.id) if e.name == "decision"]
    before = service.counts()

    flipped = cli(
        app.url, "replay", str(job.id), "--mode", "dry-run", "--version", "v2", "--app", APP_SPEC
    )
    new_call = cli(
        app.url, "replay", str(job.id), "--mode", "dry-run", "--version", "v3", "--app", APP_SPEC
    )

    assert service.counts() == before
    assert flipped.returncode == 1, flipped.stdout + flipped.stderr
    assert "FIRST DIVERGENCE at step 'decide'" in flipped.stdout
    assert f"recorded (seq {recorded_decision.seq})" in flipped.stdout
    assert "'value': True" in flipped.stdout and "'value': False" in flipped.stdout
    assert "decision ship: recorded [True] now [False]" in flipped.stdout
    assert new_call.returncode == 1, new_call.stdout + new_call.stderr
    assert "stopped: the recording has no call 'fraud.score'" in new_call.stdout


def test_call_the_recording_lacks_stops_the_dry_run_naming_it(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    report = dry_run(app, job.id, version="v3")

    assert service.counts() == before, "the new call reached the network"
    assert "/fraud/1" not in service.counts()
    assert report.outcome_now.status == "failed"
    assert report.outcome_now.error_class == "replay"
    assert report.error is not None
    assert "the recording has no call 'fraud.score'" in report.error
    assert report.first_divergence is not None
    assert report.first_divergence.step == "check_stock", "v3 ran fraud_check where v1 did not"
    [denied] = [e for e in derived_events(app, report.trace_id) if e.name == "replay.denied"]
    assert "fraud.score" in denied.data["error"]
    assert [e.name for e in derived_events(app, report.trace_id) if e.name == "call"] == []


def test_dry_run_of_a_failed_attempt_fails_the_same_way_without_real_calls(
    app: replayq.App, service: Service
) -> None:
    service.fail_next("/email")
    job = record_dead(app)
    before = service.counts()

    report = dry_run(app, job.id)

    assert service.counts() == before
    assert report.outcome_recorded.status == report.outcome_now.status == "failed"
    assert not report.diverged, report.to_dict()
    assert report.outcome_now == report.outcome_recorded, "same class, same message"
    assert report.outcome_now.error is not None
    assert report.outcome_now.error.startswith("HTTPError: ")
    assert report.retry_now == report.retry_recorded == "dead: not_retryable"
    [failed] = [e for e in derived_events(app, report.trace_id) if e.name == "effect.failed"]
    assert failed.data["replayed"] is True


def test_dry_run_of_a_call_with_other_arguments_diverges_instead_of_reusing_the_answer(
    app_factory: AppFactory,
) -> None:
    """A recorded response answers only the request it was recorded for."""
    app = app_factory()
    asked: list[str] = []

    def price(sku: str) -> dict[str, int]:
        asked.append(sku)
        return {"cents": 100 if sku == "sku-1" else 999}

    @app.job("quote", version="v1")
    def quote_v1(ctx: replayq.Context, sku: str) -> dict[str, int]:
        return dict(ctx.call("price.get", price, sku))

    @app.job("quote", version="v2", candidate=True)
    def quote_v2(ctx: replayq.Context, sku: str) -> dict[str, int]:
        return dict(ctx.call("price.get", price, sku + "-eu"))

    job = run_inline(app, "quote", {"sku": "sku-1"})
    assert asked == ["sku-1"]

    report = dry_run(app, job.id, version="v2")

    assert asked == ["sku-1"], "a dry-run must never call the real function"
    assert report.diverged
    assert report.outcome_now.status == "failed"
    assert report.error is not None and "other arguments" in report.error


def test_dry_run_without_keep_writes_nothing_and_reports_the_same(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    before = service.counts()

    kept = dry_run(app, job.id, version="v2")
    unkept = dry_run(app, job.id, version="v2", keep=False)

    assert service.counts() == before
    with app.storage.transaction(readonly=True) as tx:
        assert tx.trace_query(TraceQuery(trace_id=unkept.trace_id)) == []
        assert tx.branch_get(unkept.branch) is None
        assert tx.branch_get(kept.branch) is not None
        assert [e.name for e in tx.trace_query(TraceQuery(trace_id=kept.trace_id))][
            -1
        ] == "replay.finished"
    assert unkept.diverged and kept.diverged
    assert unkept.first_divergence == kept.first_divergence
    assert unkept.decisions == kept.decisions
    assert unkept.state_writes == kept.state_writes
    assert unkept.outcome_now == kept.outcome_now


@pytest.mark.parametrize("processes", [1, 2])
def test_dry_run_many_reports_each_job_as_dry_run_does(
    app: replayq.App, service: Service, processes: int
) -> None:
    jobs = [record(app, order_id) for order_id in (1, 2, 3)]
    before = service.counts()
    from replayq.replay.engine import dry_run_many

    many = dry_run_many(app, [j.id for j in jobs], keep=False, processes=processes)
    changed = dry_run_many(app, [j.id for j in jobs], version="v2", processes=processes)

    assert service.counts() == before, "a bulk dry-run made real requests"
    assert [r.job_id for r in many] == [j.id for j in jobs]
    assert not any(r.diverged for r in many), [r.to_dict() for r in many]
    assert [r.outcome_now for r in many] == [Outcome("succeeded", result=j.result) for j in jobs]
    assert all(r.diverged and r.decisions for r in changed)
    single = dry_run(app, jobs[0].id, version="v2")
    assert changed[0].first_divergence == single.first_divergence
    with app.storage.transaction(readonly=True) as tx:
        assert all(tx.trace_query(TraceQuery(trace_id=r.trace_id)) == [] for r in many)
        assert all(tx.trace_query(TraceQuery(trace_id=r.trace_id)) for r in changed)


def test_cli_dry_run_with_no_keep_reports_the_divergence_and_writes_no_branch(
    app: replayq.App, service: Service
) -> None:
    job = record(app)
    with app.storage.transaction(readonly=True) as tx:
        before = len(tx.trace_query(TraceQuery(job_id=job.id)))

    flipped = cli(
        app.url,
        "replay",
        str(job.id),
        "--mode",
        "dry-run",
        "--version",
        "v2",
        "--no-keep",
        "--app",
        APP_SPEC,
    )

    assert flipped.returncode == 1, flipped.stdout + flipped.stderr
    assert "FIRST DIVERGENCE at step 'decide'" in flipped.stdout
    with app.storage.transaction(readonly=True) as tx:
        assert len(tx.trace_query(TraceQuery(job_id=job.id))) == before
        branches = tx.connection.execute("SELECT COUNT(*) FROM rq_branches").fetchone()[0]
        lineage = tx.connection.execute("SELECT COUNT(*) FROM rq_lineage").fetchone()[0]
    assert (branches, lineage) == (0, 0), "a --no-keep dry-run wrote its branch or lineage"
