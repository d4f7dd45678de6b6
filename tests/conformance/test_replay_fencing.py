"""Fencing in a replay of the past (docs/replay.md, "Locks and fencing").

A replay takes no real lock and is judged by the recording, never by the lock table as it
is now: a lock taken again after the recording (a newer fencing token) neither rejects a
kept dry-run's write nor a fork's, and a write that fencing rejected in the recording is
rejected again, even once the lock has moved on. Live attempts (workers, reruns) are
fenced for real (``test_fencing.py``, ``tests/acceptance/test_context_fencing.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import replayq
from replayq.model import JobState, TraceEvent
from replayq.recording.locks import break_lock
from replayq.recording.state import StateStore
from replayq.replay.engine import dry_run, fork
from replayq.replay.rerun import rerun
from replayq.storage.protocol import lock_get
from replayq.testing import run_inline
from tests.apps import replay_truth
from tests.replay_support import cli, derived_events
from tests.services import Service

AppFactory = Callable[..., replayq.App]
TRUTH_APP = "tests.apps.replay_truth:app"
LOCK = "stock:sku-1"


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return replay_truth.declare(app_factory())


@pytest.fixture(autouse=True)
def no_interlude() -> Iterator[None]:
    yield
    replay_truth.INTERLUDE.clear()


def newest_token(app: replayq.App) -> int:
    with app.storage.transaction(readonly=True) as tx:
        row = lock_get(tx, LOCK)
    assert row is not None
    return row.fencing_token


def named(events: list[TraceEvent], name: str) -> TraceEvent:
    [event] = [e for e in events if e.name == name]
    return event


def reserve_twice(app: replayq.App) -> tuple[replayq.Job, replayq.Job]:
    """Two jobs write under the same lock, one after the other: the second's token is newer."""
    first = run_inline(app, "reserve", {"sku": "sku-1", "qty": 1})
    second = run_inline(app, "reserve", {"sku": "sku-1", "qty": 2})
    assert first.state == second.state == JobState.SUCCEEDED, (first.last_error, second.last_error)
    tokens = [
        named(app.trace(j.id), "lock.acquired").data["fencing_token"] for j in (first, second)
    ]
    assert tokens[0] < tokens[1] == newest_token(app)
    return first, second


def test_a_kept_dry_run_under_a_lock_taken_again_since_reproduces_the_recording(
    app: replayq.App, service: Service
) -> None:
    first, _ = reserve_twice(app)
    recorded = app.trace(first.id)
    token = named(recorded, "lock.acquired").data["fencing_token"]
    production = app.state.history("stock", "sku-1")

    report = dry_run(app, first.id)
    shown = cli(app.url, "replay", str(first.id), "--mode", "dry-run", "--app", TRUTH_APP)
    [bulk] = replayq.dry_run_many(app, [first.id], keep=True)

    assert bulk.error is None and not bulk.diverged, bulk.to_dict()
    assert [v.data for v in StateStore(app, bulk.branch).history("stock", "sku-1")] == [
        {"reserved": 1}
    ]
    assert report.error is None, report.error
    assert report.outcome_now.status == "succeeded", report.outcome_now.to_dict()
    assert not report.diverged, report.to_dict()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "StaleFencingTokenError" not in shown.stdout + shown.stderr
    now = derived_events(app, report.trace_id)
    assert "state.write_rejected" not in [e.name for e in now]
    assert named(now, "lock.acquired").data["fencing_token"] == token
    # The write carries the fencing token it was made under, as recorded.
    assert (
        named(now, "state.write").data["fencing"]
        == named(recorded, "state.write").data["fencing"]
        == {LOCK: token}
    )
    [version] = StateStore(app, report.branch).history("stock", "sku-1")
    assert (version.data, version.fencing_token) == ({"reserved": 1}, token)
    assert app.state.history("stock", "sku-1") == production, "production state untouched"
    assert newest_token(app) == token + 1, "a replay takes no lock"


def test_a_dry_run_of_a_lock_released_with_its_steps_commit_reproduces_the_recording(
    app: replayq.App, service: Service
) -> None:
    """A live lock let go of inside its step is released by the step's commit (and taken
    back by the loop's next turn, still this attempt's); its events stay where the handler
    let go of it, so a dry-run, which takes no lock, records them where the recording has
    them, with the recorded tokens, and does not diverge."""

    @app.job("allot", retry=replayq.Retry(max_attempts=1))
    def allot(ctx: replayq.Context, n: int) -> None:
        with ctx.step("allot"):
            for turn in (1, 2):
                with ctx.lock("warehouse:1", ttl="30s"):
                    ctx.state.put("order", n, {"turn": turn})

    job = run_inline(app, "allot", {"n": 1})
    assert job.state == JobState.SUCCEEDED, job.last_error
    recorded = [e for e in app.trace(job.id) if e.kind == "domain"]

    report = dry_run(app, job.id)

    assert report.error is None, report.error
    assert not report.diverged, report.to_dict()
    now = derived_events(app, report.trace_id)

    def locks(events: list[TraceEvent]) -> list[tuple[str, Any]]:
        return [(e.name, e.data.get("fencing_token")) for e in events if e.name.startswith("lock.")]

    assert (
        locks(now)
        == locks(recorded)
        == [
            ("lock.acquired", 1),
            ("lock.released", 1),
            ("lock.acquired", 1),
            ("lock.released", 1),
        ]
    )
    names = [e.name for e in now if e.kind == "domain"]
    assert names.index("step.finished") > max(
        i for i, name in enumerate(names) if name == "lock.released"
    )
    with app.storage.transaction(readonly=True) as tx:
        assert lock_get(tx, "warehouse:1").owner_token is None  # type: ignore[union-attr]


def test_a_fork_past_a_lock_taken_again_since_writes_its_branch(
    app: replayq.App, service: Service
) -> None:
    first, _ = reserve_twice(app)
    token = named(app.trace(first.id), "lock.acquired").data["fencing_token"]

    report = fork(app, first.id, from_step="reserve")
    shown = cli(app.url, "fork", str(first.id), "--from-step", "reserve", "--app", TRUTH_APP)

    assert report.reached_fork, report.to_dict()
    assert report.error is None, report.error
    assert report.outcome_now.status == "succeeded", report.outcome_now.to_dict()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "StaleFencingTokenError" not in shown.stdout + shown.stderr
    [version] = StateStore(app, report.branch).history("stock", "sku-1")
    assert (version.data, version.fencing_token) == ({"reserved": 1}, token)
    assert app.state.get("stock", "sku-1").data == {"reserved": 2}, "production untouched"
    assert newest_token(app) == token + 1, "a fork takes no lock"


def test_a_write_fencing_rejected_is_rejected_again_after_the_lock_moved_on(
    app: replayq.App, service: Service
) -> None:
    replay_truth.INTERLUDE.append(lambda: break_lock(app, LOCK, reason="test"))
    rejected = run_inline(app, "fenced", {"sku": "sku-1"})
    replay_truth.INTERLUDE.clear()
    assert rejected.state == JobState.DEAD and rejected.last_error_class == "concurrency"
    later = run_inline(app, "reserve", {"sku": "sku-1", "qty": 2})
    assert later.state == JobState.SUCCEEDED, later.last_error
    recorded = named(app.trace(rejected.id), "state.write_rejected")

    report = dry_run(app, rejected.id)
    shown = cli(app.url, "replay", str(rejected.id), "--mode", "dry-run", "--app", TRUTH_APP)

    now = derived_events(app, report.trace_id)
    again = named(now, "state.write_rejected")
    assert {k: again.data[k] for k in ("lock", "fencing_token", "newest_token")} == {
        k: recorded.data[k] for k in ("lock", "fencing_token", "newest_token")
    }, "rejected as recorded, not by the lock table as it is now"
    assert report.outcome_now.error_class == "concurrency"
    assert report.outcome_now.error == rejected.last_error
    assert not report.diverged, report.to_dict()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert StateStore(app, report.branch).history("stock", "sku-1") == [], "it never now succeeds"
    assert app.state.get("stock", "sku-1").data == {"reserved": 2}


def test_a_rerun_holds_real_locks_and_its_write_is_fenced_by_the_lock_table(
    app: replayq.App, service: Service
) -> None:
    recorded = run_inline(app, "fenced", {"sku": "sku-1"})
    assert recorded.state == JobState.SUCCEEDED, recorded.last_error
    app.state.put("stock", "sku-1", {"reserved": 0}, expected_version=1)
    # While the rerun's call is in flight, the lock it holds is broken (a newer token).
    replay_truth.INTERLUDE.append(lambda: break_lock(app, LOCK, reason="test"))

    report = rerun(app, recorded.id, allow_effects=["none"])

    assert report.outcome.status == "failed", report.to_dict()
    assert report.outcome.error_class == "concurrency"
    assert "StaleFencingTokenError" in str(report.outcome.error)
    rejected = named(derived_events(app, report.trace_id), "state.write_rejected")
    assert rejected.data["fencing_token"] < rejected.data["newest_token"]
    assert app.state.get("stock", "sku-1").data == {"reserved": 0}, "the write was refused"
