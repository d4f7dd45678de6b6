"""The worker on every backend, driven in-process with a frozen clock and a seeded rng.

Retries, dead-lettering, lease expiry and the owner-token compare-and-set are
checked by calling ``Worker.lease``/``execute``/``reap`` directly, so every
delay and deadline is exact.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

import replayq
from replayq.model import TraceEvent
from replayq.storage.protocol import JobRedeliver

AppFactory = Callable[..., replayq.App]
SEED = 20240607
POLICY = replayq.Retry(max_attempts=5, base="2s", cap="10s", jitter="full", on=("transient",))


class Flaky(Exception):
    """A foreign exception the contract maps to ``transient``."""


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def runs() -> dict[str, int]:
    """How many times each handler actually ran (execution, not delivery)."""
    return {}


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock, runs: dict[str, int]) -> replayq.App:
    app = app_factory(clock=clock, rng=random.Random(SEED))

    def count(name: str) -> None:
        runs[name] = runs.get(name, 0) + 1

    @app.job("always_transient", lease="30s", retry=POLICY)
    def always_transient(ctx: replayq.Context, n: int) -> None:
        count("always_transient")
        raise replayq.TransientError("upstream timed out")

    @app.job("invalid", retry=POLICY)
    def invalid(ctx: replayq.Context, order_id: int) -> None:
        count("invalid")
        raise replayq.ValidationError(f"order {order_id} is not paid")

    @app.job("buggy", retry=POLICY)
    def buggy(ctx: replayq.Context) -> None:
        count("buggy")
        raise KeyError("missing")

    @app.job("mapped", retry=POLICY, errors={Flaky: "transient"})
    def mapped(ctx: replayq.Context) -> None:
        count("mapped")
        if runs["mapped"] == 1:
            raise Flaky("first call fails")

    @app.job("ok", lease="10s", retry=replayq.Retry(max_attempts=2))
    def ok(ctx: replayq.Context, n: int) -> dict[str, int]:
        count("ok")
        return {"n": n, "attempt": ctx.attempt}

    return app


def events(app: replayq.App, job_id: int, name: str) -> list[TraceEvent]:
    return [event for event in app.trace(job_id) if event.name == name]


def run_once(worker: replayq.Worker) -> replayq.Job:
    """Lease exactly one job and run it to a settled state."""
    [job] = worker.lease(1)
    worker.execute(job)
    return job


# -- retry classes ----------------------------------------------------------------------------


def test_validation_error_goes_to_dead_at_once_with_its_reason(app: replayq.App) -> None:
    job_id = app.enqueue("invalid", {"order_id": 7})

    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert job.attempt == 1
    assert job.dead_reason == replayq.DeadReason.NOT_RETRYABLE
    assert job.last_error_class == "validation"
    assert "order 7 is not paid" in job.last_error
    assert events(app, job_id, "retry.scheduled") == []
    [dead] = events(app, job_id, "job.dead")
    assert dead.data["reason"] == "not_retryable"
    assert dead.data["error_class"] == "validation"


def test_transient_failures_retry_with_jittered_capped_backoff_then_go_dead(
    app: replayq.App, clock: replayq.FrozenClock, runs: dict[str, int]
) -> None:
    job_id = app.enqueue("always_transient", {"n": 1})
    worker = replayq.Worker(app)
    expected_rng = random.Random(SEED)

    for attempt in range(1, POLICY.max_attempts):
        assert run_once(worker).attempt == attempt
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.QUEUED
        assert job.last_error_class == "transient"
        retry = events(app, job_id, "retry.scheduled")[-1]
        ceiling = min(10.0, 2.0 * 2 ** (attempt - 1))
        delay = retry.data["delay"]
        assert retry.data["reason"] == "transient"
        assert retry.data["ceiling"] == pytest.approx(ceiling)
        assert 0 <= delay <= ceiling
        assert delay == pytest.approx(expected_rng.uniform(0, ceiling))
        assert job.run_at == pytest.approx(clock.now() + delay)
        assert retry.data["run_at"] == pytest.approx(clock.now() + delay)

        clock.advance(delay * 0.99)
        assert worker.lease(1) == [], "a retry is not leased before its run_at"
        clock.advance(delay * 0.01 + 0.001)

    run_once(worker)
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert job.attempt == POLICY.max_attempts
    assert job.dead_reason == replayq.DeadReason.ATTEMPTS_EXHAUSTED
    assert runs["always_transient"] == POLICY.max_attempts
    delays = [e.data["delay"] for e in events(app, job_id, "retry.scheduled")]
    ceilings = [e.data["ceiling"] for e in events(app, job_id, "retry.scheduled")]
    assert ceilings == [2.0, 4.0, 8.0, 10.0], "exponential from base, capped"
    assert len(set(delays)) == len(delays), "full jitter: delays are not a fixed schedule"


def test_unclassified_exception_is_not_retried_by_default(app: replayq.App) -> None:
    job_id = app.enqueue("buggy", {})
    run_once(replayq.Worker(app))
    job = app.get_job(job_id)
    assert (job.state, job.attempt, job.last_error_class) == (replayq.JobState.DEAD, 1, "unknown")
    assert "KeyError" in job.last_error


def test_foreign_exception_mapped_to_transient_is_retried_and_succeeds(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("mapped", {})
    worker = replayq.Worker(app)
    run_once(worker)
    assert app.get_job(job_id).last_error_class == "transient"
    clock.advance(POLICY.cap_seconds)
    run_once(worker)
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == (replayq.JobState.SUCCEEDED, 2)


def test_succeeded_job_stores_result_and_one_success_event(app: replayq.App) -> None:
    job_id = app.enqueue("ok", {"n": 3})
    run_once(replayq.Worker(app, worker_id="w1"))
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED
    assert job.result == {"n": 3, "attempt": 1}
    assert job.owner_token is None
    names = [event.name for event in app.trace(job_id)]
    assert names == ["job.enqueued", "job.leased", "job.succeeded"]
    hlcs = [event.hlc for event in app.trace(job_id)]
    assert hlcs == sorted(hlcs) and len(set(hlcs)) == len(hlcs)


# -- bad input at the worker ------------------------------------------------------------------


def test_unknown_job_type_goes_to_dead_without_retrying(app: replayq.App) -> None:
    job_id = app.enqueue("ghost", {"x": 1}, check=False)
    worker = replayq.Worker(app)

    run_once(worker)

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert job.dead_reason == "unknown_job_type"
    assert job.attempt == 1
    assert worker.lease(10) == [], "nothing left to retry"
    assert events(app, job_id, "retry.scheduled") == []


def test_payload_that_does_not_fit_the_handler_goes_to_dead_as_malformed(
    app: replayq.App, app_factory: AppFactory, clock: replayq.FrozenClock, runs: dict[str, int]
) -> None:
    producer = app_factory(clock=clock)  # declares no handlers: it cannot check the payload
    job_id = producer.enqueue("ok", {"wrong": 1}, check=False)
    run_once(replayq.Worker(app))
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == (replayq.JobState.DEAD, 1)
    assert job.dead_reason == "malformed_payload"
    assert "'n'" in job.last_error
    assert "ok" not in runs, "the handler never ran"


# -- leases and the owner-token compare-and-set -----------------------------------------------


def test_expired_lease_is_reaped_and_redelivered_and_the_stale_owner_cannot_write(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("ok", {"n": 1})
    stale, fresh = replayq.Worker(app, worker_id="stale"), replayq.Worker(app, worker_id="fresh")
    [stale_job] = stale.lease(1)

    clock.advance(9.9)
    assert fresh.reap() == 0, "a lease is honoured until its deadline"
    clock.advance(0.2)
    assert fresh.reap() == 1
    [fresh_job] = fresh.lease(1)
    assert (fresh_job.id, fresh_job.attempt, fresh_job.redelivery_count) == (job_id, 2, 1)
    fresh.execute(fresh_job)
    settled = app.get_job(job_id)

    stale.execute(stale_job)

    after = app.get_job(job_id)
    assert after == settled, "the stale owner's late completion changed nothing"
    assert after.result == {"n": 1, "attempt": 2}
    [rejected] = events(app, job_id, "job.write_rejected")
    assert rejected.worker_id == "stale"
    assert stale.stats.rejected == 1
    names = [event.name for event in app.trace(job_id)]
    assert names.count("job.succeeded") == 1
    assert (
        names.index("lease.expired") < names.index("job.redelivered") < names.index("job.succeeded")
    )


def test_stale_owner_failure_cannot_schedule_a_retry(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("always_transient", {"n": 1})
    stale, fresh = replayq.Worker(app, worker_id="stale"), replayq.Worker(app, worker_id="fresh")
    [stale_job] = stale.lease(1)
    clock.advance(31)
    fresh.reap()
    [fresh_job] = fresh.lease(1)

    stale.execute(stale_job)

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.RUNNING
    assert job.owner_token == fresh_job.owner_token
    assert events(app, job_id, "retry.scheduled") == []
    assert [e.worker_id for e in events(app, job_id, "job.write_rejected")] == ["stale"]


def test_lease_expiry_on_the_last_attempt_goes_to_dead(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("ok", {"n": 1})
    worker = replayq.Worker(app)
    for _ in range(2):  # max_attempts=2; both leases expire
        worker.lease(1)
        clock.advance(11)
        worker.reap()
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert job.dead_reason == "lease_expired_attempts_exhausted"
    assert worker.lease(1) == []


def test_dead_job_requeued_with_a_reason_runs_again(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("invalid", {"order_id": 1})
    worker = replayq.Worker(app)
    run_once(worker)

    with pytest.raises(replayq.ConfigurationError, match="reason"):
        app.requeue(job_id, reason="  ")
    assert app.requeue(job_id, reason="order was paid by hand") is True

    job = app.get_job(job_id)
    assert job.state is replayq.JobState.QUEUED
    assert job.max_attempts == job.attempt + 1
    [requeued] = events(app, job_id, "job.requeued")
    assert requeued.data["reason"] == "order was paid by hand"
    assert app.requeue(job_id, reason="again") is False, "only dead jobs are requeued"
    assert run_once(worker).attempt == 2


def test_burst_worker_drains_every_job_and_stops(
    app: replayq.App, clock: replayq.FrozenClock, runs: dict[str, int]
) -> None:
    ids = [app.enqueue("ok", {"n": n}) for n in range(20)]
    stats = replayq.Worker(app, concurrency=4, burst=True, poll_interval=0.01).run()
    assert stats.succeeded == 20
    assert {job.id for job in app.list_jobs(states=["succeeded"])} == set(ids)
    assert runs["ok"] == 20


def test_a_burst_run_puts_back_the_signal_handlers_it_found(
    app: replayq.App, runs: dict[str, int]
) -> None:
    """While it runs, SIGINT and SIGTERM stop the worker; once it returns, a script's
    Ctrl-C raises ``KeyboardInterrupt`` again and its own SIGTERM handler is its own."""

    def scripts_own(signum: int, frame: FrameType | None) -> None:
        raise AssertionError("not called: the test only looks at which handler is set")

    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.signal(signal.SIGTERM, scripts_own)
    try:
        app.enqueue("ok", {"n": 1})
        seen: list[Any] = []

        @app.job("look")
        def look(ctx: replayq.Context) -> None:
            seen.append(signal.getsignal(signal.SIGINT))

        app.enqueue("look", {})
        stats = replayq.Worker(app, burst=True, poll_interval=0.01).run()
        assert stats.succeeded == 2
        assert getattr(seen[0], "__self__", None) is not None, "the worker's own while it ran"
        assert signal.getsignal(signal.SIGINT) is before_int
        assert signal.getsignal(signal.SIGTERM) is scripts_own
    finally:
        signal.signal(signal.SIGTERM, before_term)


# -- ack and refill in one transaction (the executor loop's path) -----------------------------


def take_queued(worker: replayq.Worker) -> replayq.Job:
    """The job ``lease`` queued for the executors (tests drive ``_execute`` directly)."""
    job: replayq.Job = worker._work.get_nowait()
    return job


def grouping(app: replayq.App, worker_id: str, **options: Any) -> replayq.Worker:
    """A worker whose successes wait for a group commit, as in ``run()`` (tests drive
    ``_execute`` and ``_commit_group`` directly)."""
    worker = replayq.Worker(app, worker_id=worker_id, **options)
    worker._grouping = True
    return worker


def counted_commits(app: replayq.App, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every write transaction the app's storage opens from now on."""
    storage = app.storage
    transaction = storage.transaction
    opened: list[bool] = []

    def counted(*, readonly: bool = False) -> Any:
        if not readonly:
            opened.append(True)
        return transaction(readonly=readonly)

    monkeypatch.setattr(storage, "transaction", counted)
    return opened


def test_a_group_commit_acks_its_jobs_and_leases_the_freed_slots_in_one_transaction(
    app: replayq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = (app.enqueue("ok", {"n": n}) for n in range(3))
    worker = grouping(app, "w", concurrency=1, prefetch=1)
    assert [job.id for job in worker.lease(2, ahead=1)] == [first, second]

    worker._execute(take_queued(worker))
    assert app.get_job(first).state is replayq.JobState.RUNNING, "the ack waits in memory"
    assert worker._inflight[first].acking, "held, so the heartbeat still extends it"
    worker._execute(take_queued(worker))
    commits = counted_commits(app, monkeypatch)
    worker._commit_group(worker._take_acks(), refill=True)

    assert len(commits) == 1, "both acks and the next lease in one transaction"
    for job_id in (first, second):
        assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
        assert [e.worker_id for e in events(app, job_id, "job.succeeded")] == ["w"]
    refilled = take_queued(worker)
    assert refilled.id == third
    stored = app.get_job(third)
    assert stored.state is replayq.JobState.RUNNING
    assert stored.owner_token == refilled.owner_token is not None
    [leased] = events(app, third, "job.leased")
    assert leased.data["owner_token"] == refilled.owner_token
    assert set(worker._inflight) == {third}, "acked jobs forgotten, the new lease held"
    assert worker.stats.leased == 3 and worker.stats.succeeded == 2


def test_a_group_commit_that_acks_a_keyed_job_leases_the_next_job_of_its_key_with_it(
    app: replayq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease after a group's acks sees them: the next job of an acked job's ordering
    key is leased in the same commit (on PostgreSQL with no savepoint around the claim),
    never beside the one before it."""

    @app.job("keyed", ordering="account:{account}")
    def keyed(ctx: replayq.Context, account: str, n: int) -> int:
        return n

    first, second, third = (app.enqueue("keyed", {"account": "a", "n": n}) for n in range(3))
    worker = grouping(app, "w", concurrency=1, prefetch=1)
    assert [job.id for job in worker.lease(2, ahead=1)] == [first], "one running per key"
    worker._execute(take_queued(worker))
    commits = counted_commits(app, monkeypatch)
    worker._commit_group(worker._take_acks(), refill=True)

    assert len(commits) == 1, "the ack and the lease of the next job in one transaction"
    assert app.get_job(first).state is replayq.JobState.SUCCEEDED
    assert take_queued(worker).id == second
    assert app.get_job(second).state is replayq.JobState.RUNNING
    assert app.get_job(third).state is replayq.JobState.QUEUED, "behind the running one"
    [succeeded] = events(app, first, "job.succeeded")
    [leased] = events(app, second, "job.leased")
    assert succeeded.hlc < leased.hlc, "the ack before the lease it made possible"
    assert worker.stats.succeeded == 1 and worker.stats.leased == 2


def test_a_lost_lease_rolls_its_group_back_and_the_others_commit_without_it(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    first, second, third = (app.enqueue("ok", {"n": n}) for n in range(3))
    stale = grouping(app, "stale", concurrency=1, prefetch=1)
    leased = {job.id: job for job in stale.lease(2, ahead=1)}
    stale._execute(take_queued(stale))
    stale._execute(take_queued(stale))
    # The first job's lease is taken back before its ack commits (a reaper's compare-and-set).
    token = leased[first].owner_token
    assert token is not None
    with app.storage.transaction() as tx:
        assert tx.job_transition(JobRedeliver(first, token, clock.now(), 99))

    stale._commit_group(stale._take_acks(), refill=False)

    assert [e.worker_id for e in events(app, first, "job.write_rejected")] == ["stale"]
    assert events(app, first, "job.succeeded") == []
    assert app.get_job(first).state is replayq.JobState.QUEUED
    assert app.get_job(second).state is replayq.JobState.SUCCEEDED, "the others still commit"
    assert [e.worker_id for e in events(app, second, "job.succeeded")] == ["stale"]
    assert app.get_job(third).state is replayq.JobState.QUEUED
    assert stale._inflight == {} and stale._take_acks() == []
    assert stale.stats.rejected == 1 and stale.stats.succeeded == 1


def test_a_refused_ack_rolls_back_the_lease_of_its_group_and_the_retry_leases_once(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """A group commit that also leases (on PostgreSQL pipelined: the compare-and-set's
    answer read only with the lease's) and whose ack is refused rolls back whole, its
    lease with it: the group commits again without the refused ack, and each job it
    leases is leased once, by the try that committed."""
    first, second, third = (app.enqueue("ok", {"n": n}) for n in range(3))
    stale = grouping(app, "stale", concurrency=2, prefetch=0)
    leased = {job.id: job for job in stale.lease(2)}
    assert set(leased) == {first, second}
    stale._execute(take_queued(stale))
    stale._execute(take_queued(stale))
    token = leased[first].owner_token
    assert token is not None
    with app.storage.transaction() as tx:  # a reaper took the first job back
        assert tx.job_transition(JobRedeliver(first, token, clock.now(), 99))

    refilled = stale._commit_group(stale._take_acks(), refill=True)

    assert [e.worker_id for e in events(app, first, "job.write_rejected")] == ["stale"]
    assert events(app, first, "job.succeeded") == []
    assert app.get_job(second).state is replayq.JobState.SUCCEEDED
    assert [e.worker_id for e in events(app, second, "job.succeeded")] == ["stale"]
    # The first try leased the requeued job and the third too, then rolled back: the try
    # that committed leased them again, and only its leases left events.
    assert sorted(job.id for job in refilled) == [first, third]
    assert len(events(app, first, "job.leased")) == 2, "its first lease and this one"
    assert len(events(app, third, "job.leased")) == 1
    for job in refilled:
        stored = app.get_job(job.id)
        assert stored.state is replayq.JobState.RUNNING
        assert stored.owner_token == job.owner_token is not None
    assert set(stale._inflight) == {first, third} and stale._take_acks() == []
    assert stale.stats.rejected == 1 and stale.stats.succeeded == 1


def test_a_stopping_worker_acks_without_leasing_more(app: replayq.App) -> None:
    first, second = app.enqueue("ok", {"n": 1}), app.enqueue("ok", {"n": 2})
    worker = grouping(app, "w")
    worker.lease(1)
    worker._execute(take_queued(worker))
    worker.stop()

    worker._commit_group(worker._take_acks(), refill=True)

    assert app.get_job(first).state is replayq.JobState.SUCCEEDED
    assert app.get_job(second).state is replayq.JobState.QUEUED
    assert worker._work.empty()


def test_one_heartbeat_statement_extends_every_held_lease_and_only_the_lost_one_is_lost(
    app: replayq.App, clock: replayq.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replayq.storage.sql_transaction import SqlTransaction
    from replayq.storage.sqlite import SqliteTransaction

    ids = [app.enqueue("ok", {"n": n}) for n in range(3)]
    worker = replayq.Worker(app, worker_id="beating", concurrency=3)
    leased = {job.id: job for job in worker.lease(3)}
    assert sorted(leased) == ids
    extends: list[str] = []

    # Each backend's transaction class runs its statements through its own ``execute``.
    for cls in (SqlTransaction, SqliteTransaction):
        execute = cls.execute

        def counted(
            tx: SqlTransaction, name: str, params: object = None, execute: Any = execute
        ) -> object:
            if name == "leases_extend":
                extends.append(name)
            return execute(tx, name, params)

        monkeypatch.setattr(cls, "execute", counted)
    flights = list(worker._inflight.values())
    clock.advance(5)
    worker.extend_leases(flights)
    assert len(extends) == 1, "one statement for the three leases"
    assert all(app.get_job(i).lease_deadline == pytest.approx(clock.now() + 10) for i in ids)

    # A reaper took the first job back (its compare-and-set on the owner token).
    with app.storage.transaction() as tx:
        first = leased[ids[0]]
        assert first.owner_token is not None
        assert tx.job_transition(JobRedeliver(first.id, first.owner_token, clock.now(), 99))
    extends.clear()
    clock.advance(5)
    worker.extend_leases(flights)
    assert len(extends) == 1, "the same one statement learns which lease was lost"
    assert {f.job.id for f in flights if f.lost.is_set()} == {ids[0]}
    assert [e.name for e in app.trace(ids[0])][-1] == "lease.lost"
    assert [e.name for e in app.trace(ids[1])][-2:] == ["lease.extended", "lease.extended"]
    assert app.get_job(ids[2]).lease_deadline == pytest.approx(clock.now() + 10)


def test_a_burst_run_leaves_no_heartbeat_thread_behind(
    app_factory: Callable[..., replayq.App],
) -> None:
    import threading
    import time

    app = app_factory()
    app.job("noop")(lambda ctx: None)
    before = {t.ident for t in threading.enumerate() if t.name == "replayq-heartbeat"}
    for _ in range(3):
        app.enqueue("noop")
        replayq.Worker(app, burst=True, poll_interval=0.01).run()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [
            t
            for t in threading.enumerate()
            if t.name == "replayq-heartbeat" and t.ident not in before
        ]
        if not left:
            break
        time.sleep(0.05)
    assert left == [], "each burst run's heartbeat thread ended with it"
    assert app.count_jobs(states=["succeeded"]) == 3
