"""Settling in-doubt effects from Python: resolve by hand, or a reconciler asked before parking."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq import EffectRecord, EffectResolution
from replayq.replay.engine import dry_run

LEASE = 5.0


def _leave_in_doubt(app: replayq.App, clock: replayq.FrozenClock, job_id: int) -> None:
    """Run the job until its effect has started, then let its lease expire: the outcome is lost."""
    started, release = threading.Event(), threading.Event()
    app.blockers = (started, release)  # type: ignore[attr-defined]
    stale = replayq.Worker(app, worker_id="crashed")
    [job] = stale.lease(1)
    thread = threading.Thread(target=stale.execute, args=(job,), daemon=True)
    thread.start()
    assert started.wait(20)
    clock.advance(LEASE + 1)
    assert replayq.Worker(app, worker_id="reaper").reap() == 1
    release.set()
    thread.join(20)
    app.blockers = None  # type: ignore[attr-defined]


@pytest.fixture
def setup(
    app_factory: Callable[..., replayq.App],
) -> tuple[replayq.App, replayq.FrozenClock, list[int]]:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    return app, clock, declare_charge(app)


def declare_charge(app: replayq.App) -> list[int]:
    """A ``charge`` job whose effect can be held mid-call (``_leave_in_doubt``); its calls."""
    calls: list[int] = []
    app.blockers = None  # type: ignore[attr-defined]

    @app.job("charge", lease=f"{LEASE}s", heartbeat="0s")
    def charge(ctx: replayq.Context, n: int) -> Any:
        def effect() -> dict[str, int]:
            calls.append(n)
            if app.blockers is not None:  # type: ignore[attr-defined]
                started, release = app.blockers  # type: ignore[attr-defined]
                started.set()
                release.wait(20)
            return {"charge": len(calls)}

        return ctx.effect("payment.charge", effect, key=f"charge-{n}")

    app.register_contracts()
    return calls


def _run(app: replayq.App) -> None:
    worker = replayq.Worker(app, worker_id="worker")
    for job in worker.lease(1):
        worker.execute(job)


def test_an_effect_in_flight_under_a_held_lease_is_waited_for_then_in_doubt_once_it_ends(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
) -> None:
    """Two jobs of one key: the first's attempt is inside the effect (its record
    ``started``) and holds its lease. The second neither parks, nor asks the reconciler,
    nor runs the effect: its attempt fails ``concurrency`` and is retried. Once that lease
    has ended (no reaper has run yet: the job still reads ``running``) the record is in
    doubt: the reconciler is asked, knows nothing, and the second job parks."""
    app, clock, calls = setup
    asked: list[str] = []

    @app.reconciler("payment.charge")
    def ask_provider(record: EffectRecord) -> EffectResolution | None:
        asked.append(record.key)
        return None

    first, second = (app.enqueue("charge", {"n": 6}) for _ in range(2))
    started, release = threading.Event(), threading.Event()
    app.blockers = (started, release)  # type: ignore[attr-defined]
    owner = replayq.Worker(app, worker_id="owner")
    [job] = owner.lease(1)
    assert job.id == first
    thread = threading.Thread(target=owner.execute, args=(job,), daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        _run(app)
        waiting = app.get_job(second)
        assert (waiting.state, waiting.last_error_class) == (replayq.JobState.QUEUED, "concurrency")
        assert "in flight in job" in (waiting.last_error or "")
        [failed] = [e for e in app.trace(second) if e.name == "effect.failed"]
        assert (failed.data["in_flight_job"], failed.data["in_flight_attempt"]) == (first, 1)
        assert asked == [] and calls == [6], "not asked, not run again: it is not in doubt"
        # Its dry-run fails alike from the recording, reaching no real world.
        report = dry_run(app, second, attempt=1, keep=False)
        assert not report.diverged, report.to_dict()
        assert report.outcome_now.error_class == "concurrency"

        clock.advance(LEASE + 1)  # the first's lease ends (its retry is due as well)
        assert app.get_job(first).state is replayq.JobState.RUNNING, "not reaped"
        _run(app)
        parked = app.get_job(second)
        assert (parked.state, parked.dead_reason) == (replayq.JobState.DEAD, "effect_in_doubt")
        assert asked == ["charge-6"]
    finally:
        release.set()
        thread.join(20)
    assert calls == [6], "made once"


def test_resolved_success_is_returned_from_the_ledger_after_requeue(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
) -> None:
    app, clock, calls = setup
    job_id = app.enqueue("charge", {"n": 1})
    _leave_in_doubt(app, clock, job_id)
    _run(app)
    dead = app.get_job(job_id)
    assert (dead.state, dead.dead_reason, dead.last_error_class) == (
        replayq.JobState.DEAD,
        "effect_in_doubt",
        "in_doubt",
    )
    [doubt] = app.effects_in_doubt()
    assert (doubt.key, doubt.kind, doubt.job_id) == ("charge-1", "payment.charge", job_id)

    record = app.resolve_effect(
        "charge-1", succeeded=True, result={"charge": 99}, reason="seen in the dashboard", by="ana"
    )
    assert record.status == "succeeded" and not record.in_doubt
    assert app.requeue(job_id, reason="settled")
    _run(app)
    done = app.get_job(job_id)
    assert done.state is replayq.JobState.SUCCEEDED and done.result == {"charge": 99}
    assert calls == [1], "the effect was not called again"
    [resolved] = [e for e in app.trace(job_id) if e.name == "effect.resolved"]
    assert (resolved.data["by"], resolved.data["reason"]) == ("ana", "seen in the dashboard")


def test_resolved_failure_lets_the_effect_run_exactly_once_more(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
) -> None:
    app, clock, calls = setup
    job_id = app.enqueue("charge", {"n": 2})
    _leave_in_doubt(app, clock, job_id)
    _run(app)
    app.resolve_effect("charge-2", succeeded=False, reason="no such charge", by="ana")
    assert app.requeue(job_id, reason="settled")
    _run(app)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert calls == [2, 2]


def test_a_record_not_in_doubt_cannot_be_resolved(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
) -> None:
    app, _, _ = setup
    app.enqueue("charge", {"n": 3})
    _run(app)
    with pytest.raises(replayq.ConfigurationError, match="not in doubt"):
        app.resolve_effect("charge-3", succeeded=False, by="ana")
    with pytest.raises(replayq.ConfigurationError, match="no effect record"):
        app.resolve_effect("nothing", succeeded=False, by="ana")


@pytest.mark.parametrize(("truth", "calls_after"), [("succeeded", 1), ("failed", 2), (None, 1)])
def test_the_worker_asks_the_reconciler_before_parking(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
    truth: str | None,
    calls_after: int,
) -> None:
    app, clock, calls = setup
    asked: list[EffectRecord] = []

    @app.reconciler("payment.charge")
    def ask_provider(record: EffectRecord) -> EffectResolution | None:
        asked.append(record)
        if truth is None:
            return None
        return EffectResolution(truth == "succeeded", {"charge": "from provider"})

    job_id = app.enqueue("charge", {"n": 4})
    _leave_in_doubt(app, clock, job_id)
    _run(app)
    assert [r.key for r in asked] == ["charge-4"]
    job = app.get_job(job_id)
    assert len(calls) == calls_after
    if truth is None:
        assert job.state is replayq.JobState.DEAD and job.dead_reason == "effect_in_doubt"
    else:
        assert job.state is replayq.JobState.SUCCEEDED
        if truth == "succeeded":
            assert job.result == {"charge": "from provider"}
    reconciled = [e for e in app.trace(job_id) if e.name == "effect.reconciled"]
    assert [e.data["outcome"] for e in reconciled] == [truth or "unknown"]


def test_resolve_auto_settles_what_the_reconciler_knows(
    setup: tuple[replayq.App, replayq.FrozenClock, list[int]],
) -> None:
    app, clock, _ = setup
    job_id = app.enqueue("charge", {"n": 5})
    _leave_in_doubt(app, clock, job_id)
    _run(app)  # no reconciler yet: parked

    @app.reconciler("payment.charge")
    def ask_provider(record: EffectRecord) -> EffectResolution | None:
        return EffectResolution(succeeded=True, result={"charge": 5})

    [(record, answer, error)] = app.reconcile_effects(by="cron")
    assert record.key == "charge-5" and answer is not None and answer.succeeded and error is None
    assert app.effects_in_doubt() == []
