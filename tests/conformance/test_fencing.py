"""Fencing in the database: a worker whose lease was taken writes nothing, on every write path.

Each test holds the fault at its worst moment: the stale worker acts while the
new owner is still running the job (a barrier), not after it finished. No
heartbeat thread runs here, so the worker never learns of its lost lease from
one: only the owner-token check inside each transaction can refuse the writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from tests.services import Service, request

LEASE = 5.0


class Gates:
    """Per-worker barriers inside a handler: ``reached`` is set there, ``go`` lets it on."""

    def __init__(self) -> None:
        self.reached = {w: threading.Event() for w in ("stale", "owner")}
        self.go = {w: threading.Event() for w in ("stale", "owner")}

    def wait(self, worker_id: str) -> None:
        self.reached[worker_id].set()
        assert self.go[worker_id].wait(20), f"{worker_id} was never let on"


def _rows_table(app: replayq.App) -> Callable[[], list[tuple[Any, ...]]]:
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE fenced_rows (job_id INTEGER, worker TEXT)")

    def rows() -> list[tuple[Any, ...]]:
        with app.storage.transaction(readonly=True) as tx:
            cursor = tx.connection.execute("SELECT job_id, worker FROM fenced_rows")
            return [tuple(r) for r in cursor.fetchall()]

    return rows


def _insert(app: replayq.App, job_id: int, worker: str) -> Callable[[Any], None]:
    marker = "?" if app.storage.dialect == "sqlite" else "%s"

    def write(connection: Any) -> None:
        connection.execute(
            f"INSERT INTO fenced_rows (job_id, worker) VALUES ({marker}, {marker})",  # noqa: S608 - placeholder marker only
            (job_id, worker),
        )

    return write


def _take_over(app: replayq.App, clock: replayq.FrozenClock, stale_job: replayq.Job) -> Any:
    """Expire the stale worker's lease, reap it and lease the job to the new owner."""
    clock.advance(LEASE + 1)
    owner = replayq.Worker(app, worker_id="owner")
    assert owner.reap() == 1
    [job] = owner.lease(1)
    assert job.id == stale_job.id and job.owner_token != stale_job.owner_token
    return owner, job


def _run(worker: replayq.Worker, job: replayq.Job) -> threading.Thread:
    thread = threading.Thread(target=worker.execute, args=(job,), daemon=True)
    thread.start()
    return thread


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


def test_stale_step_commit_is_refused_while_the_new_owner_runs_the_job(
    app_factory: Callable[..., replayq.App], clock: replayq.FrozenClock, service: Service
) -> None:
    app = app_factory(clock=clock)
    rows = _rows_table(app)
    gates = Gates()

    @app.job("charge", lease=f"{LEASE}s", heartbeat="0s", effects={"warehouse.ship": "retry"})
    def charge(ctx: replayq.Context, order: int) -> dict[str, Any]:
        with ctx.step("write"):
            ctx.state.put("order", order, {"by": ctx.worker_id})
            ctx.db_write(_insert(app, ctx.job_id, ctx.worker_id))
            ctx.outbox.publish("order.charged", {"order": order, "by": ctx.worker_id})
            ctx.cache.set("price", order, {"by": ctx.worker_id})
            ctx.enqueue("noop", {})
            gates.wait(ctx.worker_id)  # the writes are pending; the step has not committed
        ctx.effect(
            "warehouse.ship",
            lambda: request("POST", f"{service.base_url}/warehouse/shipments", {"order": order}),
            key=f"ship-{order}-attempt-{ctx.attempt}",
        )
        return {"by": ctx.worker_id}

    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        return None

    app.register_contracts()
    job_id = app.enqueue("charge", {"order": 1})
    stale = replayq.Worker(app, worker_id="stale")
    [stale_job] = stale.lease(1)
    stale_thread = _run(stale, stale_job)
    assert gates.reached["stale"].wait(20)

    owner, owner_job = _take_over(app, clock, stale_job)
    owner_thread = _run(owner, owner_job)
    assert gates.reached["owner"].wait(20)

    # The new owner holds the job, its own writes pending: the stale worker commits now.
    gates.go["stale"].set()
    stale_thread.join(20)
    assert not stale_thread.is_alive()
    assert app.get_job(job_id).state is replayq.JobState.RUNNING, "still the owner's"
    assert rows() == [], "no ctx.db_write row from the stale worker"
    assert app.state.history("order", 1) == []
    assert app.cache_backend.latest("price:1", clock.now()) is None
    assert service.counts().get("/warehouse/shipments", 0) == 0, "its effect never started"
    with app.storage.transaction(readonly=True) as tx:
        assert tx.outbox_by_job(job_id) == []
        assert [j.job_type for j in tx.job_list(replayq_filter())] == ["charge"]

    gates.go["owner"].set()
    owner_thread.join(20)
    done = app.get_job(job_id)
    assert done.state is replayq.JobState.SUCCEEDED and done.result == {"by": "owner"}
    assert rows() == [(job_id, "owner")]
    assert [v.data for v in app.state.history("order", 1)] == [{"by": "owner"}]
    assert service.counts()["/warehouse/shipments"] == 1
    with app.storage.transaction(readonly=True) as tx:
        outbox = tx.outbox_by_job(job_id)
    assert len(outbox) == 1 and '"owner"' in outbox[0].payload

    events = app.trace(job_id)
    [fenced] = [e for e in events if e.name == "write.fenced"]
    assert (fenced.worker_id, fenced.attempt, fenced.status) == ("stale", 1, "rejected")
    refused = " ".join(fenced.data["refused"])
    for what in ("state order:1", "db_write", "outbox order.charged", "child job noop", "cache"):
        assert what in refused, f"{what!r} missing from the refusal: {refused}"
    assert fenced.data["owner_token"] == stale_job.owner_token
    [rolled_back] = [e for e in events if e.name == "step.rolled_back"]
    assert rolled_back.worker_id == "stale" and "LeaseLostError" in rolled_back.data["error"]
    assert [e.worker_id for e in events if e.name == "job.write_rejected"] == ["stale"]
    assert not [e for e in events if e.worker_id == "stale" and e.name == "job.failed"]


def test_stale_effect_claim_is_refused_and_the_effect_never_runs(
    app_factory: Callable[..., replayq.App], clock: replayq.FrozenClock, service: Service
) -> None:
    app = app_factory(clock=clock)
    gates = Gates()

    @app.job("ship", lease=f"{LEASE}s", heartbeat="0s")
    def ship(ctx: replayq.Context, order: int) -> Any:
        gates.wait(ctx.worker_id)
        return ctx.effect(
            "warehouse.ship",
            lambda: request("POST", f"{service.base_url}/warehouse/shipments", {"order": order}),
            key=f"ship-{order}-attempt-{ctx.attempt}",
        )

    app.register_contracts()
    job_id = app.enqueue("ship", {"order": 2})
    stale = replayq.Worker(app, worker_id="stale")
    [stale_job] = stale.lease(1)
    stale_thread = _run(stale, stale_job)
    assert gates.reached["stale"].wait(20)
    owner, owner_job = _take_over(app, clock, stale_job)
    owner_thread = _run(owner, owner_job)
    assert gates.reached["owner"].wait(20)

    gates.go["stale"].set()
    stale_thread.join(20)
    assert service.counts().get("/warehouse/shipments", 0) == 0
    assert app.effects(kind="warehouse.ship") == [], "no claim was recorded"

    gates.go["owner"].set()
    owner_thread.join(20)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert service.counts()["/warehouse/shipments"] == 1
    [record] = app.effects(kind="warehouse.ship")
    assert (record.key, record.status, record.attempt) == ("ship-2-attempt-2", "succeeded", 2)
    [fenced] = [e for e in app.trace(job_id) if e.name == "write.fenced"]
    assert fenced.worker_id == "stale"
    assert fenced.data["refused"] == ["effect claim warehouse.ship ship-2-attempt-1"]


def test_stale_effect_result_is_refused_and_kept_in_the_trace_for_whoever_settles_it(
    app_factory: Callable[..., replayq.App], clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    gates = Gates()
    taken = threading.Event()

    @app.job("ship", lease=f"{LEASE}s", heartbeat="0s")
    def ship(ctx: replayq.Context, order: int) -> Any:
        def effect() -> dict[str, str]:
            gates.wait(ctx.worker_id)  # the provider is slow; meanwhile the lease is taken
            return {"shipment": "shp-1"}

        if ctx.worker_id == "owner":
            taken.set()
            return None
        return ctx.effect("warehouse.ship", effect, key=f"ship-{order}")

    app.register_contracts()
    job_id = app.enqueue("ship", {"order": 3})
    stale = replayq.Worker(app, worker_id="stale")
    [stale_job] = stale.lease(1)
    stale_thread = _run(stale, stale_job)
    assert gates.reached["stale"].wait(20)
    clock.advance(LEASE + 1)
    assert replayq.Worker(app, worker_id="reaper").reap() == 1

    gates.go["stale"].set()
    stale_thread.join(20)
    [record] = app.effects(kind="warehouse.ship")
    assert record.status == "started" and record.in_doubt, "the outcome was not accepted"
    [fenced] = [e for e in app.trace(job_id) if e.name == "write.fenced"]
    assert fenced.data["refused"] == ["effect result warehouse.ship ship-3"]
    assert fenced.data["result"] == {"shipment": "shp-1"}, "what the provider said is kept"


def test_lease_check_holds_only_for_the_current_owner_token(
    app_factory: Callable[..., replayq.App], clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)

    @app.job("noop", lease=f"{LEASE}s")
    def noop(ctx: replayq.Context) -> None:
        return None

    app.register_contracts()
    app.enqueue("noop", {})
    [first] = replayq.Worker(app, worker_id="a").lease(1)
    assert first.owner_token is not None
    with app.storage.transaction() as tx:
        assert tx.lease_check(first.id, first.owner_token)
        assert not tx.lease_check(first.id, "someone-else")
    clock.advance(LEASE + 1)
    replayq.Worker(app, worker_id="reaper").reap()
    with app.storage.transaction() as tx:
        assert not tx.lease_check(first.id, first.owner_token), "reaped: queued, no owner"
    [second] = replayq.Worker(app, worker_id="b").lease(1)
    assert second.owner_token is not None
    with app.storage.transaction() as tx:
        assert not tx.lease_check(first.id, first.owner_token)
        assert tx.lease_check(second.id, second.owner_token)


def replayq_filter() -> Any:
    from replayq.storage.protocol import JobFilter

    return JobFilter(origin=None)
