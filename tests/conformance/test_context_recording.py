"""What passes through ``ctx`` is recorded, and a step's writes commit together or not at all.

Steps, decisions, external calls, recorded nondeterminism, child jobs and the
blob store, on every backend, with the worker driven in-process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
import zstandard

import replayq
from replayq.recording.blobs import INLINE_LIMIT_BYTES
from replayq.replay.engine import dry_run
from tests.context_support import count_rows, named, run_once

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    return app_factory(clock=clock)


def test_steps_decisions_calls_and_nondeterminism_are_recorded_in_order(
    app: replayq.App,
) -> None:
    seen: dict[str, Any] = {}

    @app.job("quote")
    def quote(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        with ctx.step("load"):
            order = ctx.state.get("order", order_id)
            route = ctx.decide("route", "express", exists=order.exists, weight_kg=3)
        with ctx.step("price"):
            price = ctx.call("tariffs.lookup", lambda zone, kg: {"eur": zone * kg}, 4, kg=3)
        seen["now"], seen["random"], seen["uuid"] = ctx.now(), ctx.random(), ctx.uuid()
        return {"route": route, "price": price["eur"]}

    job_id = app.enqueue("quote", {"order_id": 5})
    run_once(replayq.Worker(app, worker_id="w1"))

    assert app.get_job(job_id).result == {"route": "express", "price": 12}
    domain = [e for e in app.trace(job_id) if e.kind == "domain"]
    assert [(e.name, e.data.get("step_name") or e.step) for e in domain] == [
        ("step.started", "load"),
        ("state.read", "load"),
        ("decision", "load"),
        ("step.finished", "load"),
        ("step.started", "price"),
        ("call", "price"),
        ("step.finished", "price"),
        ("clock.now", None),
        ("random.random", None),
        ("random.uuid", None),
    ]
    by_name = {e.name: e for e in domain}
    assert by_name["state.read"].resource == "order:5"
    assert by_name["state.read"].resource_version == 0
    decision = by_name["decision"]
    assert decision.data["decision"] == "route"
    assert decision.data["value"] == "express"
    assert decision.data["why"] == {"exists": False, "weight_kg": 3}
    call = by_name["call"]
    assert call.status == "success"
    assert call.data["call"] == "tariffs.lookup"
    assert call.data["request"] == {"args": [4], "kwargs": {"kg": 3}}
    assert call.data["response"] == {"eur": 12}
    assert call.data["duration"] >= 0
    finished = [e for e in domain if e.name == "step.finished"]
    assert [e.status for e in finished] == ["success", "success"]
    assert all(e.data["duration"] >= 0 for e in finished)
    assert by_name["clock.now"].data["value"] == seen["now"] == app.clock.now()
    assert by_name["random.random"].data["value"] == seen["random"]
    assert by_name["random.uuid"].data["value"] == seen["uuid"]
    assert {e.worker_id for e in domain} == {"w1"}
    assert {e.attempt for e in domain} == {1}
    assert [e.seq for e in domain] == sorted(e.seq for e in domain)


def test_failed_call_records_the_error_and_the_step_fails(app: replayq.App) -> None:
    def unreachable() -> None:
        raise ConnectionError("tariff service refused the connection")

    @app.job("quote")
    def quote(ctx: replayq.Context) -> None:
        with ctx.step("price"):
            ctx.call("tariffs.lookup", unreachable)

    job_id = app.enqueue("quote", {})
    run_once(replayq.Worker(app))

    [call] = named(app, job_id, "call")
    assert call.status == "fail"
    assert "ConnectionError: tariff service refused" in call.data["error"]
    [finished] = named(app, job_id, "step.finished")
    assert (finished.status, finished.data["step_name"]) == ("fail", "price")
    job = app.get_job(job_id)
    assert job.last_error_class == "transient", "ConnectionError is transient by default"
    assert job.state is replayq.JobState.QUEUED, "and therefore retried"


def test_a_step_commits_its_writes_together_and_a_failed_step_writes_nothing(
    app: replayq.App,
) -> None:
    seen_from_outside: dict[str, Any] = {}

    @app.job("place", retry=replayq.Retry(max_attempts=1))
    def place(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("record"):
            ctx.state.put("order", order_id, {"status": "placed"})
            ctx.outbox.publish("order.placed", {"order_id": order_id})
            ctx.enqueue("notify", {"order_id": order_id})
        # The step has committed: another reader sees all of it before the job ends.
        seen_from_outside["order"] = app.state.get("order", order_id)
        seen_from_outside["outbox"] = count_rows(app.url, "rq_outbox")
        seen_from_outside["jobs"] = count_rows(app.url, "rq_jobs", "job_type = ?", ("notify",))
        with ctx.step("bill"):
            ctx.state.put("invoice", order_id, {"total": 10})
            ctx.outbox.publish("invoice.created", {"order_id": order_id})
            ctx.enqueue("notify", {"order_id": order_id, "kind": "invoice"})
            raise replayq.ValidationError("card declined")

    @app.job("notify")
    def notify(ctx: replayq.Context, order_id: int, kind: str = "order") -> None:
        return None

    job_id = app.enqueue("place", {"order_id": 1})
    run_once(replayq.Worker(app))

    assert seen_from_outside["order"].version == 1
    assert seen_from_outside["order"].data == {"status": "placed"}
    assert seen_from_outside["outbox"] == 1
    assert seen_from_outside["jobs"] == 1
    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert app.state.get("invoice", 1).version == 0, "the failed step wrote no state"
    assert count_rows(app.url, "rq_outbox") == 1, "the failed step wrote no outbox row"
    assert count_rows(app.url, "rq_jobs", "job_type = ?", ("notify",)) == 1, "nor a child job"
    assert app.state.get("order", 1).version == 1, "the committed step stays committed"
    steps = [(e.data["step_name"], e.status) for e in named(app, job_id, "step.finished")]
    assert steps == [("record", "success"), ("bill", "fail")]
    assert [e.data["topic"] for e in named(app, job_id, "outbox.written")] == [
        "order.placed",
        "invoice.created",
    ], "the failed step's intents stay in the trace for the investigator"


def test_child_jobs_carry_causation_and_correlation_ids(app: replayq.App) -> None:
    @app.job("parent")
    def parent(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("fan_out"):
            ctx.enqueue("child", {"order_id": order_id})

    @app.job("child")
    def child(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("fan_out"):
            ctx.enqueue("grandchild", {"order_id": order_id})

    @app.job("grandchild")
    def grandchild(ctx: replayq.Context, order_id: int) -> None:
        return None

    parent_id = app.enqueue("parent", {"order_id": 9})
    worker = replayq.Worker(app)
    run_once(worker)
    [enqueued] = named(app, parent_id, "child.enqueued")
    child_id = enqueued.data["child_job_id"]
    run_once(worker)
    [grand_event] = named(app, child_id, "child.enqueued")
    grandchild_id = grand_event.data["child_job_id"]

    parent_job = app.get_job(parent_id)
    child_job = app.get_job(child_id)
    grandchild_job = app.get_job(grandchild_id)
    assert child_job.job_type == "child"
    assert child_job.payload == {"order_id": 9}
    assert child_job.causation_id == str(parent_id)
    assert child_job.correlation_id == parent_job.trace_id
    assert grandchild_job.causation_id == str(child_id)
    assert grandchild_job.correlation_id == parent_job.trace_id, "correlation spans the tree"
    assert child_job.trace_id != parent_job.trace_id


def test_a_large_call_response_is_stored_once_by_hash_compressed_and_referenced(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    catalogue = {"items": [{"sku": f"SKU-{i:05d}", "name": "widget " * 4} for i in range(300)]}

    @app.job("sync")
    def sync(ctx: replayq.Context, n: int) -> int:
        with ctx.step("fetch"):
            response = ctx.call("catalogue.fetch", lambda: catalogue)
        return len(response["items"])

    first = app.enqueue("sync", {"n": 1})
    second = app.enqueue("sync", {"n": 2})
    worker = replayq.Worker(app)
    run_once(worker)
    clock.advance(5)
    run_once(worker)

    refs = []
    for job_id in (first, second):
        assert app.get_job(job_id).result == 300
        [call] = named(app, job_id, "call")
        assert call.data["response"] is None, "the event holds a reference, not the value"
        refs.append(call.output_ref)
    raw = json.dumps(catalogue, separators=(",", ":"), sort_keys=True).encode()
    assert len(raw) > INLINE_LIMIT_BYTES
    ref = refs[0]
    assert refs == [ref, ref], "the same content has the same reference"
    digest = ref.removeprefix("blob:sha256:")
    # Keyed by the hash's 32 bytes (migration 0026); the reference names it in hex.
    key = bytes.fromhex(digest)
    assert count_rows(app.url, "rq_blobs", "hash = ?", (key,)) == 1, "deduplicated"
    [(codec_name, size, stored_size, body)] = _blob_row(app, digest)
    assert codec_name == "zstd"
    assert stored_size == len(body) < size, "stored compressed"
    stored = zstandard.ZstdDecompressor().decompress(bytes(body))
    assert hashlib.sha256(stored).hexdigest() == digest, "addressed by the hash of its content"
    assert json.loads(stored) == catalogue


def _blob_row(app: replayq.App, digest: str) -> list[tuple[Any, ...]]:
    from tests.context_support import query

    return query(
        app.url,
        "SELECT codec, size, stored_size, body FROM rq_blobs WHERE hash = ?",
        (bytes.fromhex(digest),),
    )


def test_every_event_built_in_memory_or_read_back_has_every_field(app: replayq.App) -> None:
    # The recording context and the trace-pack reader build events from dictionary
    # literals (``TraceEvent.built``, unchecked): each must name every field, as the
    # dataclass's own ``__init__`` would set them.
    names = {f.name for f in fields(replayq.TraceEvent)}

    @app.job("fields")
    def handler(ctx: replayq.Context) -> None:
        with ctx.step("one"):
            ctx.decide("d", 1)
            ctx.call("c", lambda: {"ok": True})

    job_id = app.enqueue("fields", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    read_back = app.trace(job_id)
    in_memory = dry_run(app, job_id, keep=False).events_now
    assert read_back and in_memory
    for event in [*read_back, *in_memory]:
        assert vars(event).keys() == names, event
