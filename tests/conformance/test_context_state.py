"""Versioned copy-on-write state: optimistic conflicts, history with provenance, fencing, locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq import codec
from replayq.model import TraceEvent
from replayq.recording.context import Context
from replayq.recording.locks import break_lock, list_locks
from replayq.recording.world import LiveWorld
from replayq.storage.context_params import EntityGet, LockFilter, LockRelease
from replayq.storage.protocol import LeasesExtend, LockAcquire, SnapshotRead, TraceFence
from tests.context_support import (
    assert_write_rejected_under_a_taken_lock,
    count_rows,
    named,
    query,
    run_once,
)

AppFactory = Callable[..., replayq.App]
RETRY = replayq.Retry(max_attempts=3, base="1s", cap="1s")


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    return app_factory(clock=clock)


# -- optimistic concurrency -------------------------------------------------------------------


def test_optimistic_conflict_is_class_concurrency_retried_and_traced_with_versions(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    app.state.put("stock", "sku-1", {"count": 10}, expected_version=0)
    interfere = [True]

    @app.job("reserve", retry=RETRY)
    def reserve(ctx: replayq.Context, sku: str) -> int:
        with ctx.step("reserve"):
            stock = ctx.state.get("stock", sku)
            if interfere.pop() if interfere else False:
                # Another writer (a restock) lands between our read and our write.
                app.state.put("stock", sku, {"count": 50}, expected_version=stock.version)
            ctx.state.put(
                "stock", sku, {"count": stock.data["count"] - 1}, expected_version=stock.version
            )
        return int(stock.data["count"]) - 1

    job_id = app.enqueue("reserve", {"sku": "sku-1"})
    worker = replayq.Worker(app)
    run_once(worker)

    job = app.get_job(job_id)
    assert (job.state, job.last_error_class) == (replayq.JobState.QUEUED, "concurrency")
    assert "expected version 1, found 2" in job.last_error
    [conflict] = named(app, job_id, "state.conflict")
    assert conflict.resource == "stock:sku-1"
    assert (conflict.data["expected"], conflict.data["actual"]) == (1, 2)
    [failed] = named(app, job_id, "job.failed")
    assert failed.data["error_class"] == "concurrency"
    [retry] = named(app, job_id, "retry.scheduled")
    assert retry.data["reason"] == "concurrency"
    assert app.state.get("stock", "sku-1").data == {"count": 50}, "the other writer's value"

    clock.advance(2)
    run_once(worker)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert app.get_job(job_id).result == 49, "the retry read the new version"
    current = app.state.get("stock", "sku-1")
    assert (current.version, current.data) == (3, {"count": 49})


def test_a_write_that_loses_the_race_at_commit_is_a_conflict_and_writes_nothing(
    app: replayq.App,
) -> None:
    """The version check at ``put`` passed; another writer commits before the step does."""

    @app.job("rename", retry=replayq.Retry(max_attempts=1))
    def rename(ctx: replayq.Context, key: str) -> None:
        with ctx.step("rename"):
            item = ctx.state.get("item", key)
            ctx.state.put("item", key, {"name": "ours"})
            ctx.outbox.publish("item.renamed", {"key": key})
            app.state.put("item", key, {"name": "theirs"}, expected_version=item.version)

    app.state.put("item", "a", {"name": "original"}, expected_version=0)
    job_id = app.enqueue("rename", {"key": "a"})
    run_once(replayq.Worker(app))

    job = app.get_job(job_id)
    assert (job.state, job.last_error_class) == (replayq.JobState.DEAD, "concurrency")
    [conflict] = named(app, job_id, "state.conflict")
    assert (conflict.data["expected"], conflict.data["actual"]) == (1, 2)
    [rolled_back] = named(app, job_id, "step.rolled_back")
    assert rolled_back.data["step_name"] == "rename"
    assert app.state.get("item", "a").data == {"name": "theirs"}
    assert count_rows(app.url, "rq_outbox") == 0, "the step's outbox row went with it"


# -- copy-on-write and history ----------------------------------------------------------------


def test_history_lists_each_version_with_its_job_trace_parent_and_delta(
    app: replayq.App,
) -> None:
    @app.job("set_status")
    def set_status(ctx: replayq.Context, order_id: int, fields: dict[str, Any]) -> int:
        with ctx.step("write"):
            order = ctx.state.get("order", order_id)
            entity = ctx.state.put("order", order_id, {**(order.data or {}), **fields})
        return entity.version

    worker = replayq.Worker(app)
    jobs = [
        app.enqueue("set_status", {"order_id": 1, "fields": {"status": "placed", "total": 30}}),
        app.enqueue("set_status", {"order_id": 1, "fields": {"status": "paid"}}),
        app.enqueue("set_status", {"order_id": 1, "fields": {"status": "paid"}}),  # no change
        app.enqueue("set_status", {"order_id": 1, "fields": {"status": "shipped"}}),
    ]
    for _ in jobs:
        run_once(worker)

    assert [app.get_job(j).result for j in jobs] == [1, 2, 2, 3]
    history = app.state.history("order", 1)
    assert [v.version for v in history] == [1, 2, 3], "an unchanged put made no version"
    assert [v.parent_version for v in history] == [None, 1, 2]
    assert [v.job_id for v in history] == [jobs[0], jobs[1], jobs[3]]
    assert [v.trace_id for v in history] == [app.get_job(jobs[i]).trace_id for i in (0, 1, 3)]
    assert [v.attempt for v in history] == [1, 1, 1]
    assert history[0].data == {"status": "placed", "total": 30}
    assert history[1].delta == {"set": {"status": "paid"}, "unset": []}
    assert history[2].delta == {"set": {"status": "shipped"}, "unset": []}
    assert history[2].data == {"status": "shipped", "total": 30}
    [unchanged] = named(app, jobs[2], "state.unchanged")
    assert (unchanged.resource, unchanged.resource_version) == ("order:1", 2)
    assert named(app, jobs[2], "state.write") == []
    writes = named(app, jobs[1], "state.write")
    assert [(w.resource_version, w.data["parent_version"]) for w in writes] == [(2, 1)]
    assert count_rows(app.url, "rq_entity_versions") == 3, "only written entities are stored"


def test_several_writes_in_one_step_chain_versions_within_the_step(app: replayq.App) -> None:
    @app.job("two_writes")
    def two_writes(ctx: replayq.Context) -> None:
        with ctx.step("write"):
            ctx.state.get("doc", "x")
            ctx.state.put("doc", "x", {"a": 1})
            ctx.state.put("doc", "x", {"a": 1, "b": 2})
            assert ctx.state.get("doc", "x").data == {"a": 1, "b": 2}, "own writes first"

    job_id = app.enqueue("two_writes", {})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    history = app.state.history("doc", "x")
    assert [(v.version, v.parent_version, v.delta) for v in history] == [
        (1, None, {"replace": {"a": 1}}),
        (2, 1, {"set": {"b": 2}, "unset": []}),
    ]


def test_a_version_row_holds_its_value_once_as_written_and_the_trace_redacts_it(
    app: replayq.App,
) -> None:
    """A state value is the application's data: stored and read back as written, a secret
    field included (docs/secrets.md), while the ``state.write`` event in the trace is
    redacted. A delta that replaces the whole value is stored once, as the row's data (its
    delta is ``null``; a large value is in the blob store only), and history still shows
    ``{"replace": data}``."""
    large = {"lines": ["x" * 40] * 100}  # ~4.6 KB: above the inline size, a blob
    read_back: list[Any] = []

    @app.job("sign_up")
    def sign_up(ctx: replayq.Context) -> None:
        with ctx.step("create"):
            ctx.state.put("user", "u1", {"name": "ann", "password": "hunter2"})
            ctx.state.put("doc", "big", {**large, "api_key": "sk-1"})
            ctx.state.put("label", "l1", "plain text")
        with ctx.step("change"):
            ctx.state.put("user", "u1", {"name": "ann", "password": "hunter3"})

    @app.job("sign_in")
    def sign_in(ctx: replayq.Context) -> None:
        with ctx.step("load"):
            read_back.append(ctx.state.get("user", "u1").data)
            read_back.append(ctx.state.get("doc", "big").data)

    worker = replayq.Worker(app)
    jobs = [app.enqueue("sign_up", {}), app.enqueue("sign_in", {})]
    for _ in jobs:
        run_once(worker)
    assert [app.get_job(j).state for j in jobs] == [replayq.JobState.SUCCEEDED] * 2

    assert read_back == [{"name": "ann", "password": "hunter3"}, {**large, "api_key": "sk-1"}]
    assert app.state.get("user", "u1").data == {"name": "ann", "password": "hunter3"}
    rows = query(
        app.url,
        "SELECT namespace, version, data_ref, delta FROM rq_entity_versions "
        "ORDER BY namespace, version",
    )
    deltas = {(ns, v): (ref, delta) for ns, v, ref, delta in rows}
    assert deltas[("doc", 1)][0] is not None and deltas[("doc", 1)][1] == "null"
    assert deltas[("label", 1)][1] == "null" and deltas[("user", 1)][1] == "null"
    [user_1, user_2] = app.state.history("user", "u1")
    assert user_1.delta == {"replace": {"name": "ann", "password": "hunter2"}}
    assert user_2.delta == {"set": {"password": "hunter3"}, "unset": []}
    assert app.state.history("doc", "big")[0].delta == {"replace": {**large, "api_key": "sk-1"}}
    assert app.state.history("label", "l1")[0].delta == {"replace": "plain text"}
    # The trace keeps no secret: the writes' deltas are redacted.
    writes = [e for e in app.trace(jobs[0]) if e.name == "state.write"]
    assert len(writes) == 4
    assert not any(secret in repr(e.data) for e in writes for secret in ("hunter", "sk-1"))


def test_a_job_reads_the_current_version_small_large_or_absent(app: replayq.App) -> None:
    """A read of a main-branch entity: one statement without a transaction around it
    (``SnapshotRead``: SQLite without ``BEGIN``, PostgreSQL in autocommit mode), in a
    transaction where the version's data is in the blob store; the same answers on both
    backends, and the reads are traced."""
    large = {"lines": ["x" * 40] * 100}  # ~4.6 KB: above the inline size, a blob
    app.state.put("doc", "small", {"a": 1}, expected_version=0)
    app.state.put("doc", "large", large, expected_version=0)
    app.state.put("doc", "small", {"a": 2}, expected_version=1)
    seen: dict[str, Any] = {}

    @app.job("reader")
    def reader(ctx: replayq.Context) -> None:
        with ctx.step("load"):
            for key in ("small", "large", "absent"):
                entity = ctx.state.get("doc", key)
                seen[key] = (entity.version, entity.data)

    job_id = app.enqueue("reader", {})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert seen == {"small": (2, {"a": 2}), "large": (1, large), "absent": (0, None)}
    reads = [e for e in app.trace(job_id) if e.name == "state.read"]
    assert [(e.resource, e.resource_version, e.data["exists"]) for e in reads] == [
        ("doc:small", 2, True),
        ("doc:large", 1, True),
        ("doc:absent", 0, False),
    ]


def test_a_write_without_a_read_builds_on_the_current_version_small_large_or_absent(
    app: replayq.App,
) -> None:
    """``ctx.state.put`` of an entity the job did not read: the head is read as ``get``
    reads it (one statement where the data is inline; a transaction where it is in the
    blob store), and the new version's parent and delta are those of the current one. No
    ``state.read`` is traced: the job did not read."""
    large = {"lines": ["x" * 40] * 100}  # ~4.6 KB: above the inline size, a blob
    app.state.put("doc", "small", {"a": 1}, expected_version=0)
    app.state.put("doc", "small", {"a": 2}, expected_version=1)
    app.state.put("doc", "large", large, expected_version=0)

    @app.job("writer")
    def writer(ctx: replayq.Context) -> None:
        with ctx.step("write"):
            ctx.state.put("doc", "small", {"a": 3})
            ctx.state.put("doc", "large", {"lines": large["lines"][:1]})
            ctx.state.put("doc", "absent", {"a": 1})

    job_id = app.enqueue("writer", {})
    run_once(replayq.Worker(app))
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    for key, version, parent, data in (
        ("small", 3, 2, {"a": 3}),
        ("large", 2, 1, {"lines": large["lines"][:1]}),
        ("absent", 1, None, {"a": 1}),
    ):
        newest = app.state.history("doc", key)[-1]
        assert (newest.version, newest.parent_version, newest.data) == (version, parent, data)
        assert newest.job_id == job_id
    writes = {e.resource: e.data for e in app.trace(job_id) if e.name == "state.write"}
    assert writes["doc:small"]["delta"] == {"set": {"a": 3}, "unset": []}, writes["doc:small"]
    assert [writes[f"doc:{key}"]["parent_version"] for key in ("small", "large", "absent")] == [
        2,
        1,
        0,
    ]
    assert "state.read" not in [e.name for e in app.trace(job_id)]


def test_a_snapshot_read_of_the_current_version_answers_as_the_head_then_its_version(
    app: replayq.App,
) -> None:
    """Both backends read ``ctx.state.get``'s entity outside a transaction
    (``SnapshotRead``), the head joined to its version row in one statement: the same
    record as the head read and then the read of the version it names, and nothing for
    an entity without a head, while later writes move the head."""
    storage = app.storage
    assert isinstance(storage, SnapshotRead)
    app.state.put("account", 1, {"balance": 10}, expected_version=0)
    app.state.put("account", 1, {"balance": 7}, expected_version=1)
    app.state.put("account", 2, {"balance": 3}, expected_version=0)

    def two_step(key: str) -> tuple[int, Any] | None:
        where = {"branch": "main", "namespace": "account", "key": key}
        with storage.transaction(readonly=True) as tx:
            head = tx.fetchone("entity_head", where)  # type: ignore[attr-defined]
            if head is None:
                return None
            version = int(head["version"])
            row = tx.fetchone("entity_version_get", {**where, "version": version})  # type: ignore[attr-defined]
        return version, codec.loads(row["data"])

    def snapshot(key: str) -> tuple[int, Any] | None:
        with storage.snapshot_read() as tx:
            found = tx.entity_get(EntityGet("main", "account", key))
        return None if found is None else (found.version, codec.loads(found.data))

    for key in ("1", "2", "3"):
        assert snapshot(key) == two_step(key)
    assert snapshot("1") == (2, {"balance": 7}) and snapshot("3") is None
    app.state.put("account", 1, {"balance": 1}, expected_version=2)
    assert snapshot("1") == (3, {"balance": 1}) == two_step("1")


# -- locks and fencing ------------------------------------------------------------------------


def test_a_write_after_the_lock_was_broken_is_rejected_by_the_fencing_check(
    app: replayq.App,
) -> None:
    @app.job("adjust", lock="account:{account}", retry=replayq.Retry(max_attempts=1))
    def adjust(ctx: replayq.Context, account: str) -> None:
        with ctx.step("adjust"):
            balance = ctx.state.get("account", account)
            [held] = list_locks(app)
            assert (held.resource, held.fencing_token, held.job_id) == (
                f"account:{account}",
                1,
                ctx.job_id,
            )
            break_lock(app, f"account:{account}", reason="operator: holder looked stuck")
            ctx.state.put("account", account, {"balance": 5}, expected_version=balance.version)

    job_id = app.enqueue("adjust", {"account": "acc-1"})
    run_once(replayq.Worker(app))

    assert app.state.get("account", "acc-1").version == 0, "the fenced write did not land"
    [rejected] = named(app, job_id, "state.write_rejected")
    assert rejected.resource == "account:acc-1"
    assert (rejected.data["fencing_token"], rejected.data["newest_token"]) == (1, 2)
    job = app.get_job(job_id)
    assert job.last_error_class == "concurrency"
    assert "fencing token 1" in job.last_error
    [expired] = named(app, job_id, "lock.expired")
    assert expired.resource == "account:acc-1", "the holder learns its lock was lost"
    broken = [e for e in app.resource_trace("account:acc-1") if e.name == "lock.broken"]
    assert broken[0].data["reason"] == "operator: holder looked stuck"
    assert list_locks(app) == []


def test_a_write_under_a_lock_another_holder_took_meanwhile_is_rejected_and_nothing_lands(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """The lock's TTL runs out between the lock and the step's commit, and another job
    takes it (fencing token 2) while the holder's write is pending: the commit is refused
    (``state.write_rejected`` with both tokens, ``StaleFencingTokenError``, class
    concurrency), nothing is written, and the attempt's trace is the same on every
    backend. (On PostgreSQL the commit in one round trip refuses in the server, RQ003,
    and the commit made again says why: ``test_postgres_pipelined_commit``.)"""

    @app.job("take", retry=replayq.Retry(max_attempts=1))
    def take(ctx: replayq.Context) -> None:
        with ctx.lock("account:a", ttl="30s"):
            pass

    @app.job("adjust", retry=replayq.Retry(max_attempts=1))
    def adjust(ctx: replayq.Context) -> None:
        with ctx.lock("account:a", ttl="1s"), ctx.step("adjust"):
            balance = ctx.state.get("account", "a")
            ctx.state.put("account", "a", {"balance": 5}, expected_version=balance.version)
            clock.advance(2)  # the lock's TTL ran out: another holder takes it
            app.enqueue("take", {})
            run_once(replayq.Worker(app, worker_id="other"))

    job_id = app.enqueue("adjust", {})
    run_once(replayq.Worker(app, worker_id="first"))

    rejected = assert_write_rejected_under_a_taken_lock(app, job_id, "account", "a")
    assert app.state.history("account", "a") == []
    assert rejected.resource == "account:a"
    assert rejected.data["lock"] == "account:a"
    assert [e.name for e in app.trace(job_id) if e.name == "write.fenced"] == [], (
        "the lease is still held: the lock, not the lease, refused it"
    )


def test_lock_fencing_tokens_grow_per_resource_and_writes_carry_them(app: replayq.App) -> None:
    @app.job("bump", lock="counter:{name}")
    def bump(ctx: replayq.Context, name: str) -> None:
        with ctx.step("bump"):
            current = ctx.state.get("counter", name)
            ctx.state.put("counter", name, {"n": (current.data or {"n": 0})["n"] + 1})

    worker = replayq.Worker(app)
    for _ in range(3):
        app.enqueue("bump", {"name": "c"})
        run_once(worker)
    history = app.state.history("counter", "c")
    assert [(v.version, v.fencing_token) for v in history] == [(1, 1), (2, 2), (3, 3)]
    assert list_locks(app) == [], "released after each job"


# -- a lock let go of while writes under it wait for their commit -------------------------------


def holder(app: replayq.App, resource: str) -> int | None:
    """The job that holds the lock on ``resource`` now, as another worker would see it."""
    held = {lock.resource: lock.job_id for lock in list_locks(app)}
    return held.get(resource)


def domain_names(app: replayq.App, job_id: int) -> list[str]:
    return [e.name for e in app.trace(job_id) if e.kind == "domain"]


@pytest.mark.parametrize("handler", ["plain", "async"])
def test_a_lock_let_go_of_inside_a_step_is_released_by_the_commit_of_its_writes(
    app: replayq.App, handler: str
) -> None:
    """A lock on ``warehouse:1`` guards a write to ``order:N``, let go of before the step
    ends: nobody can take it until the write is committed; its release commits with the
    step, where the handler let go of it in the trace (a plain or an ``async def``
    handler alike)."""
    seen: dict[str, Any] = {}

    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl="30s"):
                ctx.state.put("order", n, {"reserved": True})
            seen["during the step"] = holder(app, "warehouse:1")
            seen["order during the step"] = app.state.get("order", n).version

    if handler == "plain":
        app.job("reserve", retry=replayq.Retry(max_attempts=1))(reserve)
    else:

        async def reserve_async(ctx: replayq.Context, n: int) -> None:
            reserve(ctx, n)

        app.job("reserve", retry=replayq.Retry(max_attempts=1))(reserve_async)
    job_id = app.enqueue("reserve", {"n": 5})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert seen == {"during the step": job_id, "order during the step": 0}
    assert holder(app, "warehouse:1") is None, "released with the step's commit"
    [version] = app.state.history("order", 5)
    assert version.fencing_token == 1
    assert domain_names(app, job_id) == [
        "step.started",
        "lock.acquired",
        "state.write",
        "lock.released",
        "step.finished",
    ]
    [released] = named(app, job_id, "lock.released")
    assert released.data["fencing_token"] == 1


def test_a_failed_steps_writes_are_dropped_and_its_lock_released_all_the_same(
    app: replayq.App,
) -> None:
    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl="30s"):
                ctx.state.put("order", n, {"reserved": True})
            raise RuntimeError("the rest of the step failed")

    job_id = app.enqueue("reserve", {"n": 6})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert app.state.history("order", 6) == [], "the failed step's write was dropped"
    assert holder(app, "warehouse:1") is None, "and its lock released"
    names = domain_names(app, job_id)
    assert names.index("lock.released") < names.index("step.finished")
    [finished] = named(app, job_id, "step.finished")
    assert finished.status == "fail"


def test_a_lock_let_go_of_outside_steps_is_released_with_the_ack_of_its_writes(
    app: replayq.App,
) -> None:
    """Writes outside steps commit with the ack: the lock they were made under is held
    until then (renewed by the heartbeat meanwhile), and released by the ack."""
    seen: list[int | None] = []

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.lock("warehouse:1", ttl="30s"):
            ctx.state.put("order", n, {"reserved": True})
        seen.append(holder(app, "warehouse:1"))

    job_id = app.enqueue("reserve", {"n": 7})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert seen == [job_id]
    assert holder(app, "warehouse:1") is None
    assert app.state.get("order", 7).data == {"reserved": True}
    names = domain_names(app, job_id)
    assert names == ["lock.acquired", "state.write", "lock.released"], names


def test_a_lock_taken_again_before_its_release_committed_is_still_this_attempts(
    app: replayq.App,
) -> None:
    """A loop that takes the lock for each item of one step: the second take finds the
    release of the first waiting for the step's commit and takes the lock back, without
    waiting for itself; both writes carry the one fencing token."""

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context) -> None:
        with ctx.step("reserve"):
            for n in (1, 2):
                with ctx.lock("warehouse:1", ttl="30s", wait="0.5s"):
                    ctx.state.put("order", n, {"reserved": True})

    job_id = app.enqueue("reserve", {})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED, app.get_job(job_id).last_error
    assert holder(app, "warehouse:1") is None
    for n in (1, 2):
        [version] = app.state.history("order", n)
        assert version.fencing_token == 1
    acquired = named(app, job_id, "lock.acquired")
    assert [e.data["fencing_token"] for e in acquired] == [1, 1]
    assert "taken back" in acquired[1].data["note"]
    assert domain_names(app, job_id).count("lock.released") == 2


def test_a_lock_that_ran_out_while_its_release_waited_is_recorded_as_expired(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """Nobody took it: the write, fenced by a token nobody moved, commits, and the pending
    ``lock.released`` says ``lock.expired`` (in its place) once the commit found it ran
    out."""

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl="1s"):
                ctx.state.put("order", n, {"reserved": True})
            clock.advance(2)

    job_id = app.enqueue("reserve", {"n": 8})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert app.state.get("order", 8).data == {"reserved": True}
    assert holder(app, "warehouse:1") is None
    assert domain_names(app, job_id) == [
        "step.started",
        "lock.acquired",
        "state.write",
        "lock.expired",
        "step.finished",
    ]
    [expired] = named(app, job_id, "lock.expired")
    assert expired.status == "fail"
    assert expired.data["note"] == "the lock's lease ran out before the holder released it"
    events = [e for e in app.trace(job_id) if e.kind == "domain"]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert len({e.seq for e in events}) == len(events)


def reserve_that_another_takes_meanwhile(
    app: replayq.App,
    ttl: str,
    run_out: Callable[[], object],
    now: Callable[[], float],
    database_clock: bool = False,
) -> dict[str, bool]:
    """Register job ``reserve``: its step writes ``order:n`` under lock ``warehouse:1``
    (``ttl``) and lets go of it, the release waiting for the step's commit; ``run_out``
    lets the lock run out, another owner takes it (``now`` its grant's time), and the step
    asks for the lock again (``wait="0.2s"``). What the job saw, filled in as it runs."""
    seen: dict[str, bool] = {}

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl=ttl):
                ctx.state.put("order", n, {"reserved": True})
            run_out()
            with app.storage.transaction() as tx:
                grant = tx.lock_transition(
                    LockAcquire("warehouse:1", "other", 0, "other", now(), 30.0, 1, database_clock)
                )
            seen["taken by the other"] = grant is not None
            try:
                with ctx.lock("warehouse:1", ttl="1s", wait="0.2s"):
                    seen["taken back"] = True
            except replayq.LockTimeoutError:
                seen["taken back"] = False
                raise

    return seen


def test_a_lock_taken_by_another_while_its_release_waited_is_not_taken_back(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """The lock ran out while its release waited for the step's commit and another job
    took it: taking it again waits for that holder (here, times out), rather than taking
    back a lock that is no longer this attempt's; the pending write under the old token
    is refused as stale, and the pending release says ``lock.expired``."""
    seen = reserve_that_another_takes_meanwhile(app, "1s", lambda: clock.advance(2), clock.now)
    job_id = app.enqueue("reserve", {"n": 9})
    run_once(replayq.Worker(app))

    assert seen == {"taken by the other": True, "taken back": False}
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert job.last_error_class == "concurrency"
    assert app.state.history("order", 9) == []
    [lock] = list_locks(app)
    assert (lock.owner_token, lock.fencing_token) == ("other", 2)
    names = domain_names(app, job_id)
    assert "lock.expired" in names and "lock.released" not in names, names
    assert names.count("lock.acquired") == 1, names
    [expired] = named(app, job_id, "lock.expired")
    assert expired.data["note"] == "the lock expired or was broken before the holder finished"
    assert names.index("lock.expired") < names.index("lock.timeout")


def test_a_lock_lost_while_its_release_waited_and_taken_anew_records_both_holds(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """Another job took the lock and let go of it while its release waited: taking it
    again acquires it anew (a new fencing token); the first hold's pending release says
    ``lock.expired`` and the second's ``lock.released``, each once, and the new lock is
    released by the step's commit (which refuses the write under the old token)."""

    @app.job("reserve", retry=replayq.Retry(max_attempts=1))
    def reserve(ctx: replayq.Context, n: int) -> None:
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl="1s"):
                ctx.state.put("order", n, {"reserved": True})
            clock.advance(2)
            with app.storage.transaction() as tx:
                now = clock.now()
                assert tx.lock_transition(LockAcquire("warehouse:1", "other", 0, "o", now, 30, 1))
                assert tx.lock_transition(LockRelease("warehouse:1", "other", 2))
            with ctx.lock("warehouse:1", ttl="1s", wait="0.2s") as lock:
                assert lock.fencing_token == 3
                ctx.state.put("order", n + 1, {"reserved": True})

    job_id = app.enqueue("reserve", {"n": 11})
    run_once(replayq.Worker(app))

    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert holder(app, "warehouse:1") is None, "the new hold released by the step's commit"
    locks = [(e.name, e.data.get("fencing_token")) for e in app.trace(job_id)]
    locks = [lock for lock in locks if lock[0].startswith("lock.")]
    assert locks == [
        ("lock.acquired", 1),
        ("lock.expired", 1),
        ("lock.acquired", 3),
        ("lock.released", 3),
    ], locks


def test_a_lock_taken_by_another_while_its_release_waited_is_not_taken_back_database_clock(
    app_factory: AppFactory,
) -> None:
    """As above, with the database's clock judging locks (the real clock): the
    take-back's bound is the monotonic clock's, read before the grant was sent."""
    app = app_factory()
    seen = reserve_that_another_takes_meanwhile(
        app, "0.2s", lambda: time.sleep(0.3), lambda: 0.0, database_clock=True
    )
    job_id = app.enqueue("reserve", {"n": 10})
    run_once(replayq.Worker(app))

    assert seen == {"taken by the other": True, "taken back": False}
    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert app.state.history("order", 10) == []
    [lock] = list_locks(app)
    assert lock.owner_token == "other"


def test_a_lock_held_by_another_job_times_out_as_concurrency(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    @app.job("inner", retry=replayq.Retry(max_attempts=1))
    def inner(ctx: replayq.Context) -> None:
        with ctx.lock("printer", ttl="30s", wait="0.2s"):
            pass

    @app.job("outer", retry=replayq.Retry(max_attempts=1))
    def outer(ctx: replayq.Context) -> None:
        with ctx.lock("printer", ttl="30s"):
            run_once(replayq.Worker(app, worker_id="other"))

    outer_id = app.enqueue("outer", {})
    inner_id = app.enqueue("inner", {}, delay="1s")
    clock.advance(1)
    run_once(replayq.Worker(app, worker_id="first"))

    assert app.get_job(outer_id).state is replayq.JobState.SUCCEEDED
    inner_job = app.get_job(inner_id)
    assert inner_job.last_error_class == "concurrency"
    [timeout] = named(app, inner_id, "lock.timeout")
    assert (timeout.data["holder_job"], timeout.data["holder_token"]) == (outer_id, 1)


def test_a_lock_wanted_while_a_write_under_it_commits_waits_without_a_deadlock(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    """One worker runs two jobs: ``holder``'s step commits a write under lock ``res`` (its
    fence keeps the lock's row ``FOR SHARE`` on PostgreSQL) while ``wanter`` asks for
    ``res`` and the worker's heartbeat extends both leases in one statement. The
    acquisition waits for the commit and then finds the lock held; nothing deadlocks.

    The worst moment, held by hand: the fence has passed, the acquisition waits for the
    lock's row, the heartbeat has taken ``holder``'s row and waits for ``wanter``'s, and
    the commit's fenced append then needs ``holder``'s row. An acquisition that asked
    its own lease (``wanter``'s row ``FOR SHARE``) before the lock's row closed the
    cycle, and PostgreSQL aborted one of the three (``deadlock detected``)."""

    @app.job("hold")
    def hold(ctx: replayq.Context) -> None:
        pass

    @app.job("want")
    def want(ctx: replayq.Context) -> None:
        pass

    app.enqueue("hold", {})
    app.enqueue("want", {})
    worker = replayq.Worker(app, worker_id="w")
    runtime = worker.runtime
    holder, wanter = sorted(worker.lease(2), key=lambda job: job.job_type)
    assert (holder.job_type, wanter.job_type) == ("hold", "want")
    assert holder.owner_token is not None and wanter.owner_token is not None
    with app.storage.transaction() as tx:
        grant = tx.lock_transition(LockAcquire("res", "h", holder.id, "w", clock.now(), 30.0, 1))
    assert grant is not None
    ctx = Context(
        runtime,
        wanter,
        runtime.registry.handler("want", wanter.handler_version),
        worker_id="w",
        world=LiveWorld(None, None),
        owner_token=wanter.owner_token,
    )
    outcomes: dict[str, Any] = {}

    def take() -> None:
        try:
            with ctx.lock("res", ttl="30s", wait="0.3s"):
                outcomes["take"] = "granted"
        except Exception as exc:
            outcomes["take"] = exc

    def beat() -> None:
        leases = ((holder.id, holder.owner_token, 30.0), (wanter.id, wanter.owner_token, 30.0))
        try:
            with app.storage.transaction() as tx:
                outcomes["beat"] = tx.lease_extend(LeasesExtend(leases, clock.now(), False))
        except Exception as exc:
            outcomes["beat"] = exc

    taker, beater = threading.Thread(target=take), threading.Thread(target=beat)
    try:
        with app.storage.transaction() as tx:
            fence = LockFilter("res", newer_than=grant.fencing_token)
            assert tx.lock_list(fence) == [], "the write's fence passes"
            taker.start()
            taker.join(0.5)
            beater.start()
            beater.join(0.5)
            event = TraceEvent("t", "step.committed", clock.now(), 2, job_id=holder.id)
            outcomes["commit"] = tx.trace_append([event], TraceFence(holder.id, holder.owner_token))
    except Exception as exc:
        outcomes["commit"] = exc
    taker.join(30)
    beater.join(30)
    assert outcomes["commit"] is True, outcomes
    assert outcomes["beat"] == {holder.id, wanter.id}, outcomes
    assert isinstance(outcomes["take"], replayq.LockTimeoutError), outcomes


@pytest.mark.parametrize("ttl", [0, "0s", -1, -0.5])
def test_a_lock_ttl_of_zero_or_negative_is_rejected_on_the_job_contract(
    app: replayq.App, ttl: Any
) -> None:
    def handler(ctx: replayq.Context, order_id: int) -> None:
        return None

    with pytest.raises(replayq.ConfigurationError, match="lock_ttl"):
        app.job("ship", lock="order:{order_id}", lock_ttl=ttl)(handler)
    assert app.job_types() == [], "nothing was declared"


def test_a_negative_lock_ttl_string_is_rejected_on_the_job_contract(app: replayq.App) -> None:
    def handler(ctx: replayq.Context, order_id: int) -> None:
        return None

    with pytest.raises(replayq.ConfigurationError, match="lock_ttl"):
        app.job("ship", lock="order:{order_id}", lock_ttl="-5s")(handler)


@pytest.mark.parametrize("ttl", [0, "0s", -3])
def test_a_lock_ttl_of_zero_or_negative_is_rejected_by_ctx_lock(app: replayq.App, ttl: Any) -> None:
    entered: list[int] = []

    @app.job("print", retry=RETRY)
    def print_job(ctx: replayq.Context) -> None:
        with ctx.lock("printer", ttl=ttl):
            entered.append(1)

    job_id = app.enqueue("print", {})
    run_once(replayq.Worker(app))

    assert entered == [], "the lock was never taken"
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD, "a configuration error is not retried"
    assert "ttl must be positive" in job.last_error
    assert "printer" in job.last_error
    assert count_rows(app.url, "rq_locks") == 0
