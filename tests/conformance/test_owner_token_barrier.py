"""Only the lease holder writes: a stale worker acts while the new owner is still running.

Worker A leases a job, its lease expires, worker B reaps it, leases it again and starts
running it; B's handler is held at a barrier. Only then does A act: it acks, schedules
a retry, buries, heartbeats or commits a step. The job is ``running`` at that moment, so
the state condition of those writes cannot tell A from B: only the owner token (or the
lost-lease check at a step commit) can refuse A. A planted bug that drops that condition
makes these tests fail, on both backends (``scripts/mutate.py`` plants them).

An effect claim, an outbox row and a child job committed before any heartbeat noticed
the lost lease are refused too: every commit checks the owner token in the database
(``lease_check``), not only the heartbeat's flag. A step whose commit comes after A's
heartbeat found the lease lost (the beat came while the step ran) is refused the same
way; once the heartbeat found it lost, A's handler stops at its next cancel point
(``LeaseLostError``) and starts no step (``test_worker_lost_lease_running.py`` for calls).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import replayq
from replayq.model import Job
from replayq.storage.protocol import LeasesExtend, idem_get

AppFactory = Callable[..., replayq.App]
LEASE = "1s"


@dataclass
class Takeover:
    """A job stolen from a stale worker ``a`` by ``b``, whose handler is running right now."""

    app: replayq.App
    clock: replayq.FrozenClock
    a: replayq.Worker
    stale: Job
    b: replayq.Worker
    owned: Job
    b_running: threading.Event = field(default_factory=threading.Event)
    b_may_finish: threading.Event = field(default_factory=threading.Event)

    def act_as_a(self) -> None:
        """Run the stale lease's attempt to its settle (the handler sees ``worker_id`` a)."""
        self.a.execute(self.stale)

    def assert_still_owned_by_b(self) -> None:
        job = self.app.get_job(self.owned.id)
        assert job.state is replayq.JobState.RUNNING, f"A moved B's running job to {job.state}"
        assert job.owner_token == self.owned.owner_token, "A took the owner token"
        assert job.worker_id == "b"
        assert job.lease_deadline == self.owned.lease_deadline, "B's lease was changed"
        assert (job.result, job.last_error, job.dead_reason) == (None, None, None)

    def rejected_writes_of_a(self) -> list[str]:
        return [
            e.data["attempted"]
            for e in self.app.trace(self.owned.id)
            if e.name == "job.write_rejected" and e.worker_id == "a"
        ]


def hold_handler(takeover: Callable[[], Takeover]) -> Callable[..., Any]:
    """B waits at the barrier; A does what the payload says."""

    def hold(ctx: replayq.Context, outcome: str) -> dict[str, str]:
        t = takeover()
        if ctx.worker_id == "b":
            t.b_running.set()
            assert t.b_may_finish.wait(30), "the test never let B finish"
            return {"by": "b"}
        if outcome == "transient":
            raise replayq.TransientError("A's attempt failed after its lease was taken")
        if outcome == "validation":
            raise replayq.ValidationError("A's attempt found the payload wrong")
        if outcome in ("step", "beat inside the step"):
            with ctx.step("write"):
                if outcome == "beat inside the step":  # past the step's cancel point
                    t.a.extend_leases([t.a._inflight[t.stale.id]])  # A's heartbeat: lost
                ctx.state.put("order", 1, {"written_by": "a"})
        return {"by": "a"}

    return hold


@contextmanager
def taken_over(app_factory: AppFactory, outcome: str) -> Iterator[Takeover]:
    """Yield while B's handler runs; afterwards B finishes and the job must be B's alone."""
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    holder: list[Takeover] = []
    retry = replayq.Retry(max_attempts=3, base="1s", cap="1s")
    app.job("hold", lease=LEASE, heartbeat="0.3s", retry=retry)(hold_handler(lambda: holder[0]))
    job_id = app.enqueue("hold", {"outcome": outcome})

    a = replayq.Worker(app, worker_id="a")
    [stale] = a.lease(1)
    clock.advance(2)  # A's lease expires; A does not know yet
    b = replayq.Worker(app, worker_id="b")
    assert b.reap() == 1
    [owned] = b.lease(1)
    assert owned.id == stale.id == job_id
    assert owned.owner_token != stale.owner_token
    t = Takeover(app, clock, a, stale, b, owned)
    holder.append(t)

    runner = threading.Thread(target=b.execute, args=(owned,), name="worker-b")
    runner.start()
    try:
        assert t.b_running.wait(30), "B's handler never started"
        yield t
    finally:
        t.b_may_finish.set()
        runner.join(30)
    assert not runner.is_alive()
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED, f"B's run ended {job.state}"
    assert job.result == {"by": "b"}
    names = [e.name for e in app.trace(job_id)]
    assert names.count("job.succeeded") == 1
    assert "job.dead" not in names


def test_stale_ack_while_the_new_owner_runs_is_rejected_by_the_owner_token(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "succeed") as t:
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.rejected_writes_of_a() == ["job.succeeded"]
    assert t.a.stats.succeeded == 0


def test_stale_retry_while_the_new_owner_runs_is_rejected_by_the_owner_token(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "transient") as t:
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.rejected_writes_of_a() == ["retry.scheduled"]
    assert "retry.scheduled" not in [e.name for e in t.app.trace(t.owned.id)]


def test_stale_bury_while_the_new_owner_runs_is_rejected_by_the_owner_token(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "validation") as t:  # not retryable: A buries the job
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.rejected_writes_of_a() == ["job.dead"]


def test_stale_heartbeat_while_the_new_owner_runs_does_not_extend_the_lease(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "succeed") as t:
        t.clock.advance(0.5)  # a lease extended now would end later than B's
        with t.app.storage.transaction() as tx:
            beat = LeasesExtend(((t.stale.id, str(t.stale.owner_token), 30.0),), t.clock.now())
            extended = tx.lease_extend(beat)
        assert extended == set()
        t.assert_still_owned_by_b()

        flight = t.a._inflight[t.stale.id]  # A's own heartbeat, as its thread would beat
        t.a.extend_leases([flight])
        assert flight.lost.is_set(), "A's heartbeat must learn that its lease is gone"
        t.assert_still_owned_by_b()
        lost = [e for e in t.app.trace(t.owned.id) if e.name == "lease.lost"]
        assert [e.worker_id for e in lost] == ["a"]


def test_step_commit_after_the_heartbeat_found_the_lease_lost_writes_nothing(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "beat inside the step") as t:
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.app.state.get("order", 1).version == 0, "A's step committed after its lease"
        names = [(e.name, e.worker_id, e.status) for e in t.app.trace(t.owned.id)]
        assert ("step.rolled_back", "a", "fail") in names
        assert ("write.fenced", "a", "rejected") in names


def test_a_handler_whose_lease_the_heartbeat_found_lost_starts_no_step(
    app_factory: AppFactory,
) -> None:
    with taken_over(app_factory, "step") as t:
        t.a.extend_leases([t.a._inflight[t.stale.id]])  # A's heartbeat: lease lost
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.app.state.get("order", 1).version == 0, "A's step committed after its lease"
        by_a = [e for e in t.app.trace(t.owned.id) if e.worker_id == "a"]
        assert "step.started" not in [e.name for e in by_a], "A started a step it had lost"
        [rejected] = [e for e in by_a if e.name == "job.write_rejected"]
        assert "stops before its next step" in rejected.data["attempted"]
        assert (t.a.stats.rejected, t.a.stats.retried) == (1, 0)


# -- paths fenced in the database by issue 10 -------------------------------------------------


def stale_writer(app_factory: AppFactory, body: Callable[[replayq.Context], None]) -> Takeover:
    """A takeover whose stale attempt runs ``body`` (no heartbeat told A it lost the lease)."""
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    holder: list[Takeover] = []

    def write(ctx: replayq.Context, n: int) -> dict[str, str]:
        t = holder[0]
        if ctx.worker_id == "b":
            t.b_running.set()
            assert t.b_may_finish.wait(30)
            return {"by": "b"}
        body(ctx)
        return {"by": "a"}

    app.job("write", lease=LEASE, heartbeat="0.3s", idempotency="write:{n}")(write)
    app.job("child")(lambda ctx: None)
    app.enqueue("write", {"n": 1})
    a = replayq.Worker(app, worker_id="a")
    [stale] = a.lease(1)
    clock.advance(2)
    b = replayq.Worker(app, worker_id="b")
    b.reap()
    [owned] = b.lease(1)
    t = Takeover(app, clock, a, stale, b, owned)
    holder.append(t)
    return t


@contextmanager
def b_running(t: Takeover) -> Iterator[None]:
    runner = threading.Thread(target=t.b.execute, args=(t.owned,), name="worker-b")
    runner.start()
    try:
        assert t.b_running.wait(30)
        yield
    finally:
        t.b_may_finish.set()
        runner.join(30)


def test_stale_effect_claim_while_the_new_owner_runs_is_refused_and_the_effect_not_run(
    app_factory: AppFactory,
) -> None:
    charged: list[str] = []
    t = stale_writer(
        app_factory, lambda ctx: ctx.effect("card.charge", lambda: charged.append(ctx.worker_id))
    )
    with b_running(t):
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert charged == [], "a worker without the lease ran a real effect"
        with t.app.storage.transaction(readonly=True) as tx:
            assert idem_get(tx, "write:1:card.charge") is None


def test_stale_outbox_event_while_the_new_owner_runs_is_not_committed(
    app_factory: AppFactory,
) -> None:
    def publish(ctx: replayq.Context) -> None:
        with ctx.step("publish"):
            ctx.outbox.publish("orders", {"n": 1})

    t = stale_writer(app_factory, publish)
    with b_running(t):
        t.act_as_a()
        t.assert_still_owned_by_b()
        with t.app.storage.transaction(readonly=True) as tx:
            assert tx.outbox_by_job(t.owned.id) == [], "the stale worker's event was committed"


def test_stale_child_enqueue_while_the_new_owner_runs_is_not_committed(
    app_factory: AppFactory,
) -> None:
    def spawn(ctx: replayq.Context) -> None:
        with ctx.step("spawn"):
            ctx.enqueue("child", {})

    t = stale_writer(app_factory, spawn)
    with b_running(t):
        t.act_as_a()
        t.assert_still_owned_by_b()
        assert t.app.list_jobs(job_type="child") == [], "the stale worker's child job exists"


@pytest.mark.parametrize("path", ["outbox", "child"])
def test_outbox_and_child_jobs_of_a_step_after_the_heartbeat_found_the_lease_lost_are_refused(
    app_factory: AppFactory, path: str
) -> None:
    def body(ctx: replayq.Context) -> None:  # ``t`` is bound below, before A runs this
        with ctx.step(path):
            if path == "outbox":
                ctx.outbox.publish("orders", {"n": 1})
            else:
                ctx.enqueue("child", {})
            # A's heartbeat: lease lost, after the cancel points, before the step's commit.
            t.a.extend_leases([t.a._inflight[t.stale.id]])

    t = stale_writer(app_factory, body)
    with b_running(t):
        t.act_as_a()
        t.assert_still_owned_by_b()
        with t.app.storage.transaction(readonly=True) as tx:
            assert tx.outbox_by_job(t.owned.id) == []
        assert t.app.list_jobs(job_type="child") == []
