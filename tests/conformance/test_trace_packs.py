"""The trace stored as packs: every event comes back as recorded, in fewer rows.

A transaction's events of one job attempt are one ``rq_trace`` row (storage/packs.py).
The readers must still return each event with every field, in HLC order, and the
``rq_events`` view (what the SQL signal and gate queries read) must hold the same events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import replayq
from replayq.model import TraceEvent
from replayq.storage import packs as storage_packs
from replayq.storage.protocol import TraceFence, TraceQuery
from replayq.testing import run_inline

AppFactory = Callable[..., replayq.App]


# A job's packs as readers see them: on SQLite the view rq_packs, rq_trace's and the
# job.enqueued pack kept in the job's row since migration 0023.
PACKS = {
    "sqlite": "SELECT events FROM rq_packs WHERE job_id = ?",
    "postgresql": "SELECT events FROM rq_trace WHERE job_id = %s",
}
VIEW = {
    "sqlite": "SELECT name, hlc, resource, data FROM rq_events WHERE job_id = ? ORDER BY hlc, id",
    "postgresql": (
        "SELECT name, hlc, resource, data FROM rq_events WHERE job_id = %s ORDER BY hlc, id"
    ),
}


def fields(event: TraceEvent) -> dict[str, Any]:
    out = dict(vars(event))
    out.pop("id")
    return out


def test_every_field_of_every_event_reads_back_in_hlc_order(app_factory: AppFactory) -> None:
    app = app_factory()
    events = [
        TraceEvent(
            trace_id="replay-packs",
            name=f"event.{n}",
            kind="domain" if n % 2 else "lifecycle",
            ts=1_700_000_000.0 + n * 0.25,
            # Out of order on purpose: a reader sorts by HLC, then by commit order.
            hlc=1_000 + (n * 7) % 5,
            attempt=1,
            seq=n,
            step=f"step{n}" if n % 3 else None,
            worker_id="w1",
            status="success" if n % 2 else None,
            resource=f"order:{n}" if n % 2 else None,
            resource_version=n if n % 2 else None,
            side_effect=n == 3,
            input_ref="blob:sha256:in" if n == 4 else None,
            output_ref="blob:sha256:out" if n == 1 else None,
            data={"n": n, "nested": {"list": [1, 2.5, None, "ü"]}} if n else {},
        )
        for n in range(5)
    ]
    with app.storage.transaction() as tx:
        # Two appends of one attempt in one transaction (pending events, then the ack's).
        tx.trace_append(events[:2])
        tx.trace_append(events[2:3])
    with app.storage.transaction() as tx:
        tx.trace_append(events[3:])
    with app.storage.transaction(readonly=True) as tx:
        back = tx.trace_query(TraceQuery(trace_id="replay-packs"))
        rows = tx.connection.execute("SELECT COUNT(*) FROM rq_trace").fetchone()[0]
    expected = sorted(events, key=lambda e: (e.hlc, events.index(e)))
    assert [fields(e) for e in back] == [fields(e) for e in expected]
    assert len({e.id for e in back}) == len(events), "each event keeps an id of its own"
    # One row per transaction of the trace; on SQLite a later transaction's events of the
    # same attempt join the pack the connection committed last (one row per attempt).
    assert rows == (1 if app.storage.dialect == "sqlite" else 2)


def test_a_rolled_back_commit_takes_nothing_from_the_pack_it_joined(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    base = {"trace_id": "replay-join", "attempt": 1, "worker_id": "w1", "ts": 1_700_000_000.0}
    events = [TraceEvent(name=f"event.{n}", hlc=2_000 + n, seq=n, **base) for n in range(4)]
    with app.storage.transaction() as tx:
        tx.trace_append(events[:1])
    try:
        with app.storage.transaction() as tx:
            tx.trace_append(events[1:2])  # joins the committed pack (SQLite), then is undone
            raise RuntimeError("the step failed after its events were appended")
    except RuntimeError:
        pass
    with app.storage.transaction() as tx:
        tx.trace_append(events[2:])
    with app.storage.transaction(readonly=True) as tx:
        back = tx.trace_query(TraceQuery(trace_id="replay-join"))
    assert [e.name for e in back] == ["event.0", "event.2", "event.3"]
    assert len({e.id for e in back}) == 3


def test_a_traced_job_is_a_few_rows_and_the_view_holds_every_event(
    app_factory: AppFactory,
) -> None:
    app = app_factory()

    @app.job("order.process")
    def process(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("load"):
            order = ctx.state.get("order", order_id)
            ctx.decide("fresh", not order.exists)
        with ctx.step("price"):
            ctx.call("pricing.quote", lambda: {"lines": ["x" * 50] * 200})
        with ctx.step("reserve"):
            ctx.state.put("order", order_id, {"status": "reserved"})
        with ctx.step("charge"):
            ctx.effect("payment.charge", lambda: {"paid": True}, key=f"charge:{order_id}")

    job = run_inline(app, "order.process", {"order_id": 7})
    assert job.state is replayq.JobState.SUCCEEDED
    trace = app.trace(job.id)
    with app.storage.transaction(readonly=True) as tx:
        packs = tx.connection.execute(
            PACKS[app.storage.dialect] + " ORDER BY id", (job.id,)
        ).fetchall()
        view = tx.connection.execute(VIEW[app.storage.dialect], (job.id,)).fetchall()
        by_resource = [e.name for e in tx.trace_query(TraceQuery(resource="order:7"))]
    # enqueue, lease, reserve (with load's and price's events), claim, result, ack; on
    # SQLite the attempt's commits after the lease join its pack: enqueue, the attempt.
    assert len(packs) <= (2 if app.storage.dialect == "sqlite" else 6) < len(trace), packs
    # SQLite deflates a pack's events (format 2), but for the enqueue's pack, the values of
    # its job.enqueued data (format 3); PostgreSQL keeps JSON text (format 1).
    if app.storage.dialect == "sqlite":
        assert [(type(p[0]), p[0][:1]) for p in packs] == [(bytes, b"\x03"), (bytes, b"\x02")]
    else:
        assert all(isinstance(p[0], str) and p[0].startswith("[") for p in packs), packs
    assert [(r[0], r[1], r[2], json.loads(r[3])) for r in view] == [
        (e.name, e.hlc, e.resource, e.data) for e in trace
    ]
    assert by_resource == ["state.read", "state.write"]
    names = [e.name for e in trace]
    assert names.index("call") < names.index("state.write") < names.index("effect.claimed")


def test_a_joining_commit_appends_to_the_stored_pack_and_a_rewritten_pack_is_not_joined(
    sqlite_url: str,
) -> None:
    # SQLite only: PostgreSQL joins packs only within one transaction (JSON text, rewritten).
    app = replayq.App(sqlite_url, auto_migrate=True)
    try:
        appended(app)
    finally:
        app.close()


def appended(app: replayq.App) -> None:
    base = {"trace_id": "replay-append", "attempt": 1, "worker_id": "w1", "ts": 1_700_000_000.0}
    events = [TraceEvent(name=f"event.{n}", hlc=3_000 + n, seq=n, **base) for n in range(6)]
    stored_sql = "SELECT id, events FROM rq_trace WHERE trace_id = 'replay-append' ORDER BY id"
    with app.storage.transaction() as tx:
        tx.trace_append(events[:2])
    with app.storage.transaction(readonly=True) as tx:
        [(pack_id, first)] = tx.connection.execute(stored_sql).fetchall()
    with app.storage.transaction() as tx:
        tx.trace_append(events[2:3])
    with app.storage.transaction(readonly=True) as tx:
        [(same_id, joined)] = tx.connection.execute(stored_sql).fetchall()
    # The second commit appended its own bytes: the first commit's are stored unchanged.
    assert same_id == pack_id and joined.startswith(first) and len(joined) > len(first)
    # Another writer rewrites the pack (as the ledger's trimming does): the connection's
    # next commit must not append to bytes its stream did not write, but start a pack.
    rewritten = storage_packs.deflated(storage_packs.pack_json(joined) or "")
    with app.storage.transaction() as tx:
        tx.connection.execute("UPDATE rq_trace SET events = ? WHERE id = ?", (rewritten, pack_id))
    with app.storage.transaction() as tx:
        tx.trace_append(events[3:4])
    # Events older than the pack's first HLC start a pack too (its hlc is their base).
    earlier = TraceEvent(name="event.early", hlc=2_999, seq=9, **base)
    with app.storage.transaction() as tx:
        tx.trace_append(events[4:])
    with app.storage.transaction() as tx:
        tx.trace_append([earlier])
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute(stored_sql).fetchall()
        back = tx.trace_query(TraceQuery(trace_id="replay-append"))
    assert len(rows) == 3 and rows[0][1] == rewritten
    assert [e.name for e in back] == ["event.early"] + [e.name for e in events]
    assert len({e.id for e in back}) == len(events) + 1


def test_a_fenced_commit_joining_a_pack_is_its_own_lease_check(sqlite_url: str) -> None:
    # SQLite only (deflated packs joined across commits). The append that joins the
    # connection's open pack checks the lease itself: no lease_check statement while the
    # lease holds; once it is gone nothing is appended and the commit is refused; a pack
    # rewritten since is not joined, and the lease (still held) is asked then.
    app = replayq.App(sqlite_url, auto_migrate=True)
    try:
        fenced_joins(app)
    finally:
        app.close()


def fenced_joins(app: replayq.App) -> None:
    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        return None

    app.register_contracts()
    job_id = app.enqueue("noop", {})
    [job] = replayq.Worker(app, worker_id="w1").lease(1)
    assert job.owner_token is not None
    fence = TraceFence(job.id, job.owner_token)
    base = {"trace_id": job.trace_id, "job_id": job.id, "attempt": job.attempt}
    base.update(worker_id="w1", ts=1_700_000_000.0)
    events = [TraceEvent(name=f"event.{n}", hlc=2**60 + n, seq=n, **base) for n in range(5)]
    packs_sql = "SELECT id, events FROM rq_trace WHERE job_id = ? AND attempt = 1 ORDER BY id"
    statements: list[str] = []

    def stored() -> list[tuple[int, bytes]]:
        with app.storage.transaction(readonly=True) as tx:
            return [tuple(r) for r in tx.connection.execute(packs_sql, (job_id,)).fetchall()]

    def append(group: list[TraceEvent]) -> bool:
        with app.storage.transaction() as tx:
            tx.connection.set_trace_callback(statements.append)
            try:
                return tx.trace_append(group, fence)
            finally:
                tx.connection.set_trace_callback(None)

    assert append(events[:1])
    [(pack_id, first)] = stored()
    statements.clear()
    assert append(events[1:2])
    [(same_id, joined)] = stored()
    assert same_id == pack_id and joined.startswith(first) and len(joined) > len(first)
    assert not [s for s in statements if "FROM rq_jobs" in s and s.startswith("SELECT")]

    # A pack rewritten by another writer: not joined; the lease is asked and holds.
    rewritten = storage_packs.deflated(storage_packs.pack_json(joined) or "")
    with app.storage.transaction() as tx:
        tx.connection.execute("UPDATE rq_trace SET events = ? WHERE id = ?", (rewritten, pack_id))
    assert append(events[2:3])
    [(kept_id, _), (new_id, _)] = stored()
    assert kept_id == pack_id and new_id != pack_id

    # The lease is taken (another owner token): the joining commit appends nothing.
    before = stored()
    with app.storage.transaction() as tx:
        tx.connection.execute("UPDATE rq_jobs SET owner_token = 'other' WHERE id = ?", (job_id,))
    assert not append(events[3:4])
    assert stored() == before
    with app.storage.transaction(readonly=True) as tx:
        back = tx.trace_query(TraceQuery(job_id=job_id))
    names = [e.name for e in back if e.name.startswith("event.")]
    assert names == ["event.0", "event.1", "event.2"]


def test_a_drained_jobs_lifecycle_packs_are_compact_and_read_back_as_recorded(
    sqlite_url: str,
) -> None:
    # SQLite only (PostgreSQL keeps JSON text). Each job of a lease batch is its own attempt:
    # its job.leased and its job.succeeded are packs of one event each, stored as their
    # data's values (format 4) like its job.enqueued (format 3), not deflated. A pack that
    # a later event of its attempt joins (the last leased job's ack, on the connection that
    # wrote its lease) is rewritten whole as format 2. Every reader sees the same events.
    app = replayq.App(sqlite_url, auto_migrate=True)
    try:
        drained(app)
    finally:
        app.close()


def drained(app: replayq.App) -> None:
    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        return None

    app.register_contracts()
    job_ids = [app.enqueue("noop", {}) for _ in range(3)]
    worker = replayq.Worker(app, worker_id="w1")
    leased = worker.lease(3)
    assert sorted(job.id for job in leased) == job_ids
    for job in leased:
        worker.execute(job)
    formats = {}
    for job in leased:
        assert app.get_job(job.id).state is replayq.JobState.SUCCEEDED
        trace = app.trace(job.id)
        assert [e.name for e in trace] == ["job.enqueued", "job.leased", "job.succeeded"]
        with app.storage.transaction(readonly=True) as tx:
            stored = tx.connection.execute(PACKS["sqlite"] + " ORDER BY id", (job.id,)).fetchall()
            view = tx.connection.execute(VIEW["sqlite"], (job.id,)).fetchall()
        formats[job.id] = [bytes(p[0][: 2 if p[0][:1] == b"\x04" else 1]) for p in stored]
        # The events as the worker recorded them, every field of their data back.
        enqueued, lease, ack = trace
        assert enqueued.data["priority"] == 0 and enqueued.status == "queued"
        assert (lease.kind, lease.status, lease.worker_id) == ("lifecycle", "running", "w1")
        assert lease.data == {
            "lease_deadline": job.lease_deadline,
            "owner_token": job.owner_token,
            "redelivery_count": 0,
            "version": job.handler_version,
        }
        assert (ack.kind, ack.status, ack.attempt) == ("lifecycle", "succeeded", job.attempt)
        assert set(ack.data) == {"duration", "owner_token", "version"}
        assert ack.data["owner_token"] == job.owner_token and ack.data["duration"] >= 0
        # The rq_events view (rq_pack_json in SQL) holds the same events.
        assert [(r[0], r[1], r[2], json.loads(r[3])) for r in view] == [
            (e.name, e.hlc, e.resource, e.data) for e in trace
        ]
    # A lease's pack (code 1), an ack's (code 3). An ack committed on the connection that
    # wrote its job's lease (the last of the batch) would join the lease's pack instead,
    # which is then rewritten as format 2; the others' are packs of one event each.
    compact = [b"\x03", b"\x04\x01", b"\x04\x03"]
    assert all(f in (compact, [b"\x03", b"\x02"]) for f in formats.values()), formats
    assert list(formats.values()).count(compact) >= 2, formats


def test_a_fenced_commit_joining_a_lease_pack_rewrites_it_as_its_own_lease_check(
    sqlite_url: str,
) -> None:
    # SQLite only. A lease's pack is its job.leased alone (format 4); a step's commit of the
    # attempt on the same connection joins it by rewriting it as format 2, in one statement
    # that is also the lease check (trace_rewrite_fenced): no lease_check statement while
    # the lease holds, nothing written once it is gone.
    app = replayq.App(sqlite_url, auto_migrate=True)
    try:
        fenced_rewrites(app)
    finally:
        app.close()


def fenced_rewrites(app: replayq.App) -> None:
    @app.job("noop")
    def noop(ctx: replayq.Context) -> None:
        return None

    app.register_contracts()
    first_id, second_id = app.enqueue("noop", {}), app.enqueue("noop", {})
    worker = replayq.Worker(app, worker_id="w1")
    packs_sql = "SELECT id, events FROM rq_trace WHERE job_id = ? AND attempt = 1 ORDER BY id"
    statements: list[str] = []

    def stored(job_id: int) -> list[tuple[int, bytes]]:
        with app.storage.transaction(readonly=True) as tx:
            return [tuple(r) for r in tx.connection.execute(packs_sql, (job_id,)).fetchall()]

    def step_events(job: replayq.Job) -> list[TraceEvent]:
        base = {"trace_id": job.trace_id, "job_id": job.id, "attempt": job.attempt}
        base.update(worker_id="w1", ts=1_700_000_000.0)
        return [TraceEvent(name=f"event.{n}", hlc=2**60 + n, seq=n, **base) for n in range(2)]

    def append(job: replayq.Job, group: list[TraceEvent]) -> bool:
        assert job.owner_token is not None
        with app.storage.transaction() as tx:
            tx.connection.set_trace_callback(statements.append)
            try:
                return tx.trace_append(group, TraceFence(job.id, job.owner_token))
            finally:
                tx.connection.set_trace_callback(None)

    # The lease holds: the pack is rewritten, and the rewrite was the lease check.
    [job] = worker.lease(1)
    assert job.id == first_id
    [(pack_id, leased)] = stored(job.id)
    assert leased[:2] == b"\x04\x01"
    events = step_events(job)
    assert append(job, events[:1])
    [(same_id, rewritten)] = stored(job.id)
    assert same_id == pack_id and rewritten[:1] == b"\x02"
    assert [s for s in statements if s.startswith("UPDATE rq_trace")]
    assert not [s for s in statements if "FROM rq_jobs" in s and s.startswith("SELECT")]
    # A later commit appends to the rewritten pack's stream.
    assert append(job, events[1:])
    [(_, joined)] = stored(job.id)
    assert joined.startswith(rewritten) and len(joined) > len(rewritten)
    trace = app.trace(job.id)
    assert [e.name for e in trace] == ["job.enqueued", "job.leased", "event.0", "event.1"]
    assert trace[1].data["owner_token"] == job.owner_token

    # The lease is gone (another owner token): nothing is rewritten, the commit is refused.
    [other] = worker.lease(1)
    assert other.id == second_id
    before = stored(other.id)
    assert before[0][1][:2] == b"\x04\x01"
    with app.storage.transaction() as tx:
        tx.connection.execute("UPDATE rq_jobs SET owner_token = 'x' WHERE id = ?", (other.id,))
    assert not append(other, step_events(other))
    assert stored(other.id) == before
    assert [e.name for e in app.trace(other.id)] == ["job.enqueued", "job.leased"]
