"""A worker's group commit on PostgreSQL in psycopg's pipeline mode (``pipelined``).

Real PostgreSQL; the round trips are counted in libpq's own protocol trace (``PQtrace``)
of the one pooled connection (``pool_size=1``): each ``Sync`` the client sends is a wait
for the server, as is each simple ``Query``.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from msgspec import structs
from psycopg import pq

import replayq
from replayq import JobState, Worker
from replayq.recording.state import StateStore
from replayq.replay.engine import fork
from replayq.storage.commits import CommitRefused
from replayq.storage.postgres import PostgresTransaction, parse_postgres_url
from replayq.storage.protocol import (
    BranchCreate,
    EntityFilter,
    EntityGet,
    EntityRecord,
)
from tests.context_support import assert_write_rejected_under_a_taken_lock

pytestmark = pytest.mark.postgres


@pytest.fixture
def conninfo(pg_schema_url: str) -> str:
    """libpq conninfo of the test's schema (its search_path), for the test's own DDL."""
    return parse_postgres_url(pg_schema_url)[0]


def one_connection_app(pg_schema_url: str) -> replayq.App:
    app = replayq.App(f"{pg_schema_url}&pool_size=1", auto_migrate=True)

    @app.job("ok")
    def ok(ctx: replayq.Context, n: int) -> int:
        return n

    return app


def grouping(app: replayq.App, **options: Any) -> Worker:
    """A worker whose successes wait for a group commit, as in ``run()``; the test drives
    ``_execute`` and ``_commit_group``."""
    worker = Worker(app, worker_id="w", **options)
    worker._grouping = True
    return worker


def run_leased(worker: Worker) -> None:
    while not worker._work.empty():
        worker._execute(worker._work.get_nowait())


@contextmanager
def the_connection(app: replayq.App) -> Iterator[psycopg.Connection[Any]]:
    """The pool's one connection (``pool_size=1``), back in the pool afterwards."""
    with app.storage.pool.connection() as conn:  # type: ignore[attr-defined]
        yield conn


@contextmanager
def protocol_traced(app: replayq.App, path: Path) -> Iterator[list[str]]:
    """The types of the frontend messages the pool's connection sends in the block (after
    it): ``traced_run``'s, without their texts."""
    sent: list[str] = []
    with traced_run(app, path) as messages:
        yield sent
    sent.extend(kind for kind, _ in messages)


def assert_out_of_pipeline(app: replayq.App) -> None:
    """The connection went back to the pool as it came: no pipeline, no transaction, not
    in autocommit mode (the block sets it for its own ``BEGIN``)."""
    with the_connection(app) as conn:
        assert conn.autocommit is False
        assert conn.info.transaction_status == pq.TransactionStatus.IDLE
        assert conn._pipeline is None


def test_a_group_commit_that_leases_is_two_round_trips(pg_schema_url: str, tmp_path: Path) -> None:
    """``BEGIN``, the acks' compare-and-set and the next lease in one round trip; the trace
    insert and ``COMMIT`` in a second (five before: each its own)."""
    app = one_connection_app(pg_schema_url)
    try:
        ids = [app.enqueue("ok", {"n": n}) for n in range(6)]
        worker = grouping(app, concurrency=3, prefetch=0)
        assert len(worker.lease(3)) == 3
        run_leased(worker)
        with protocol_traced(app, tmp_path / "trace.txt") as sent:
            leased = worker._commit_group(worker._take_acks(), refill=True)
        assert [job.id for job in leased] == ids[3:]
        assert sent.count("Sync") == 2, sent
        assert "Query" not in sent, "BEGIN and COMMIT go in the pipeline, not on their own"
        for job_id in ids[:3]:
            assert app.get_job(job_id).state is JobState.SUCCEEDED
        for job_id in ids[3:]:
            names = [e.name for e in app.trace(job_id)]
            assert names.count("job.leased") == 1, names
            assert app.get_job(job_id).state is JobState.RUNNING
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_pipelined_group_whose_trace_insert_fails_commits_nothing_and_is_tried_again(
    pg_schema_url: str, conninfo: str
) -> None:
    """The trace insert is sent with ``COMMIT`` and not waited for on its own: its error
    fails the commit. Nothing of the group commits (acks, lease, events), the acks wait
    for their retry with their leases held, and the retry commits them once."""
    app = one_connection_app(pg_schema_url)
    try:
        first, second, third = (app.enqueue("ok", {"n": n}) for n in range(3))
        worker = grouping(app, concurrency=2, prefetch=0)
        held = {job.id: job.owner_token for job in worker.lease(2)}
        run_leased(worker)
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION refuse_pack() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'pack refused by the test'; END $$"
            )
            admin.execute(
                "CREATE TRIGGER refuse_pack BEFORE INSERT ON rq_trace FOR EACH ROW "
                "WHEN (NEW.events LIKE '%job.succeeded%') EXECUTE FUNCTION refuse_pack()"
            )
            assert worker._commit_group(worker._take_acks(), refill=True) == []

            for job_id in (first, second):
                stored = app.get_job(job_id)
                assert stored.state is JobState.RUNNING, "no ack committed"
                assert stored.owner_token == held[job_id], "still held by this worker"
                assert "job.succeeded" not in [e.name for e in app.trace(job_id)]
            assert app.get_job(third).state is JobState.QUEUED, "the lease rolled back"
            assert [e.name for e in app.trace(third)] == ["job.enqueued"]
            assert set(worker._inflight) == {first, second}
            assert_out_of_pipeline(app)
            admin.execute("DROP TRIGGER refuse_pack ON rq_trace")

        leased = worker._commit_group(worker._take_acks(all_of_them=True), refill=True)
        assert [job.id for job in leased] == [third]
        for job_id in (first, second):
            assert app.get_job(job_id).state is JobState.SUCCEEDED
            assert [e.name for e in app.trace(job_id)].count("job.succeeded") == 1
        assert [e.name for e in app.trace(third)].count("job.leased") == 1
        assert worker.stats.succeeded == 2
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_pipelined_changes_nothing_on_a_callers_connection_or_in_autocommit(
    pg_schema_url: str, conninfo: str
) -> None:
    """Only replayq's own pooled transaction is pipelined and committed by the block: on a
    caller's connection (``conn=``) and in ``autocommit`` the statements run as before
    and the caller's transaction stays the caller's."""
    app = one_connection_app(pg_schema_url)
    try:
        with psycopg.connect(pg_schema_url) as caller:
            tx = app.storage.adopt(caller)  # type: ignore[attr-defined]
            with tx.pipelined():
                assert caller._pipeline is None
            assert caller.info.transaction_status == pq.TransactionStatus.IDLE
            caller.execute("SELECT 1")
            with tx.pipelined():
                pass
            assert caller.info.transaction_status == pq.TransactionStatus.INTRANS
            caller.rollback()
        with app.storage.autocommit() as tx, tx.pipelined():  # type: ignore[attr-defined]
            assert tx.connection._pipeline is None
        assert_out_of_pipeline(app)
    finally:
        app.close()


def frontend_messages(path: Path) -> list[tuple[str, str]]:
    """``(message type, its text)`` of each message the client sent: a ``Parse``'s
    statement (its first line), a ``Query``'s text, else what follows the type."""
    sent = []
    for line in path.read_text().splitlines():
        fields = line.split("\t", 3)
        if len(fields) < 3 or fields[0] != "F":
            continue
        kind, rest = fields[2], fields[3] if len(fields) > 3 else ""
        quoted = rest.split('"')
        text = quoted[3] if kind == "Parse" and len(quoted) > 3 else rest
        sent.append((kind, text.strip()))
    return sent


def _begins(message: tuple[str, str]) -> bool:
    kind, text = message
    return (kind, text) == ("Parse", "BEGIN") or (kind == "Query" and '"BEGIN' in text)


def _commits(message: tuple[str, str]) -> bool:
    kind, text = message
    return (kind, text) == ("Parse", "COMMIT") or (kind == "Query" and '"COMMIT"' in text)


def transaction_of(sent: list[tuple[str, str]], marker: str) -> list[tuple[str, str]]:
    """The messages of the transaction (its ``BEGIN`` to its ``COMMIT``, and in a pipeline
    the ``Sync`` after it) that sent a statement starting with ``marker``; it was
    pipelined if it starts with ``("Parse", "BEGIN")``."""
    at = next(
        (i for i, (kind, text) in enumerate(sent) if kind == "Parse" and text.startswith(marker)),
        None,
    )
    assert at is not None, f"no statement {marker!r} sent: {sent}"
    start = next(i for i in range(at, -1, -1) if _begins(sent[i]))
    end = next(i for i in range(at, len(sent)) if _commits(sent[i]))
    if sent[end][0] == "Parse":
        end = next(i for i in range(end, len(sent)) if sent[i][0] == "Sync")
    return sent[start : end + 1]


@contextmanager
def traced_run(app: replayq.App, path: Path) -> Iterator[list[tuple[str, str]]]:
    """The frontend messages of the pool's one connection while the block runs."""
    sent: list[tuple[str, str]] = []
    with path.open("w") as out:
        with the_connection(app) as conn:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            with the_connection(app) as conn:
                conn.pgconn.untrace()
    sent.extend(frontend_messages(path))


def pipelined_transaction(
    sent: list[tuple[str, str]], marker: str, syncs: int = 1
) -> list[tuple[str, str]]:
    """``transaction_of``'s transaction, asserted pipelined (its ``BEGIN`` a ``Parse``) and
    waited for ``syncs`` times (one: one round trip)."""
    block = transaction_of(sent, marker)
    assert block[0] == ("Parse", "BEGIN"), block
    assert [kind for kind, _ in block].count("Sync") == syncs, block
    return block


def run_one_traced(
    app: replayq.App, path: Path, job_type: str, args: dict[str, Any]
) -> tuple[str, Worker, list[tuple[str, str]]]:
    """Enqueue a ``job_type`` job and run it on worker ``w`` with the pool's connection
    traced (``traced_run``): the job's id, the worker, and the messages it sent."""
    job_id = app.enqueue(job_type, args)
    worker = Worker(app, worker_id="w")
    (job,) = worker.lease(1)
    with traced_run(app, path) as sent:
        worker.execute(job)
    return job_id, worker, sent


def test_a_step_commit_is_one_round_trip(pg_schema_url: str, conninfo: str, tmp_path: Path) -> None:
    """A step that writes an entity commits in one round trip (``commit_at_once``):
    ``BEGIN``, the head's compare-and-set (as a statement that refuses in the server
    unless it changed one row), the version row, the fenced events with their resource
    index (one statement) and ``COMMIT``, behind one ``Sync``. Six round trips before
    pipelining, three after it and before the refusals."""
    app = one_connection_app(pg_schema_url)

    @app.job("write")
    def write(ctx: replayq.Context, n: int) -> int:
        with ctx.step("write"):
            ctx.state.get("order", n)
            ctx.state.put("order", n, {"n": n})
        return n

    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "write", {"n": 7})
        block = pipelined_transaction(sent, "INSERT INTO rq_entity_versions")
        kinds = [kind for kind, _ in block]
        assert kinds.count("Bind") == 5, "BEGIN, head, version, events and index, COMMIT"
        assert "Query" not in kinds, "BEGIN and COMMIT go in the pipeline"
        statements = [text for kind, text in block if kind == "Parse"]
        assert "-- entity_head_insert_refusing" in statements, statements
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        assert app.state.get("order", 7).data == {"n": 7}
        first = min(e.hlc for e in app.trace(job_id) if e.resource == "order:7")
        with psycopg.connect(conninfo) as admin:
            indexed = admin.execute(
                "SELECT hlc FROM rq_trace_resources WHERE resource = 'order:7'"
            ).fetchall()
        assert indexed == [(first,)], "the step's resource indexed at its first event"
        assert_out_of_pipeline(app)
    finally:
        app.close()


def refused_and_made_again(sent: list[tuple[str, str]], marker: str) -> list[str]:
    """The one-round-trip commit that sent a statement starting with ``marker`` and was
    refused, and the statements of the commit made again after it, returned.

    Asserted: the refused one, its ``BEGIN`` to the ``ROLLBACK`` after it, waited once
    (one ``Sync``, after its ``COMMIT``: the refusal surfaces there) or, when the server's
    answer was in before the block's end and a statement sent after the refusing one
    raised it (no ``COMMIT`` queued), twice: the block reads the aborted pipeline to its
    ``Sync`` (``pipelined``) and psycopg's exit from pipeline mode always sends one more.
    The one made again read its answers (more than one ``Sync``) and failed too (a
    ``ROLLBACK``, no ``COMMIT``)."""
    at = next(
        i for i, (kind, text) in enumerate(sent) if kind == "Parse" and text.startswith(marker)
    )
    start = next(i for i in range(at, -1, -1) if _begins(sent[i]))
    end = sent.index(("Query", '"ROLLBACK"'), at)
    refused = sent[start : end + 1]
    assert refused[0] == ("Parse", "BEGIN"), refused
    ended = ("Parse", "COMMIT") in refused
    assert [kind for kind, _ in refused].count("Sync") == (1 if ended else 2), refused
    careful = sent[end + 1 : sent.index(("Query", '"ROLLBACK"'), end + 1) + 1]
    statements = [text for kind, text in careful if kind == "Parse"]
    assert "COMMIT" not in statements and [kind for kind, _ in careful].count("Sync") > 1
    return statements


def test_a_commit_refused_in_the_server_commits_nothing_and_is_made_again_to_say_why(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """Another writer moves the entity's head between the step's ``put`` and its commit:
    the one-round-trip commit's compare-and-set refuses in the server (RQ001), and
    nothing of it commits; the commit is made again with every result read, which finds
    the conflict (``state.conflict`` with both versions, class concurrency) as before.
    The attempt's events are those the careful commit alone records, once each."""
    app = one_connection_app(pg_schema_url)

    @app.job("rename", retry=replayq.Retry(max_attempts=2, base="0.01s", cap="0.01s"))
    def rename(ctx: replayq.Context, key: str) -> None:
        with ctx.step("rename"):
            item = ctx.state.get("item", key)
            ctx.state.put("item", key, {"name": f"ours {ctx.attempt}"})
            if ctx.attempt == 1:
                app.state.put("item", key, {"name": "theirs"}, expected_version=item.version)

    try:
        app.state.put("item", "a", {"name": "original"}, expected_version=0)
        job_id, worker, sent = run_one_traced(app, tmp_path / "trace.txt", "rename", {"key": "a"})
        # Made again with every answer read: the head's compare-and-set, read at once,
        # finds the conflict and ends it (no version row sent).
        statements = refused_and_made_again(sent, "-- entity_head_cas_refusing")
        assert statements[:2] == ["BEGIN", "UPDATE rq_entities SET version = $1, hlc = $2"]
        assert "INSERT INTO rq_entity_versions" not in "".join(statements)
        assert app.get_job(job_id).last_error_class == "concurrency"
        assert app.state.get("item", "a").data == {"name": "theirs"}
        events = app.trace(job_id)
        [conflict] = [e for e in events if e.name == "state.conflict"]
        assert (conflict.data["expected"], conflict.data["actual"]) == (1, 2)
        first = [e for e in events if e.kind == "domain" and e.attempt == 1]
        assert [e.name for e in first] == [
            "step.started",
            "state.read",
            "state.write",
            "state.conflict",
            "step.rolled_back",
            "step.finished",
        ], "what the careful commit alone records (as on SQLite): nothing of the refused try"
        assert len({e.seq for e in first}) == len(first)

        again = worker.lease(1)
        while not again:  # its retry is due 10 ms after the failure
            time.sleep(0.01)
            again = worker.lease(1)
        worker.execute(again[0])
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        assert app.state.get("item", "a").data == {"name": "ours 2"}
        assert [v.version for v in app.state.history("item", "a")] == [1, 2, 3]
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_commit_whose_lease_is_gone_is_refused_in_the_server_and_fenced(
    pg_schema_url: str, conninfo: str, tmp_path: Path
) -> None:
    """Another worker took the job before the step commits: the fenced trace append of the
    one-round-trip commit refuses in the server (RQ002) and nothing commits; made again
    with every result read, the commit is fenced as before (``write.fenced``, no entity
    written, ``LeaseLostError``), for each of forty jobs."""
    app = one_connection_app(pg_schema_url)

    @app.job("write")
    def write(ctx: replayq.Context, n: int) -> int:
        with ctx.step("write"):
            ctx.state.get("order", n)
            with psycopg.connect(conninfo, autocommit=True) as thief:
                thief.execute(
                    "UPDATE rq_jobs SET owner_token = 'another worker' WHERE id = %s",
                    (ctx.job_id,),
                )
            ctx.state.put("order", n, {"n": n})
        return n

    try:
        jobs = {n: app.enqueue("write", {"n": n}) for n in range(40)}
        worker = Worker(app, worker_id="w")
        (job,) = worker.lease(1)
        with traced_run(app, tmp_path / "trace.txt") as sent:
            worker.execute(job)
        # Made again with every answer read: the head's insert and the fenced append,
        # which finds the lease gone and rolls it all back.
        statements = refused_and_made_again(sent, "-- entity_head_insert_refusing")
        assert statements[:2] == [
            "BEGIN",
            "INSERT INTO rq_entities (branch, namespace, key, version, hlc)",
        ]
        # Where the refusal surfaces varies with when the server's answer comes in: at
        # the Sync, or first in the results psycopg reads while it sends the Sync, then
        # hidden by the COMMIT's "pipeline aborted" (``_first_error``). Each way, it is
        # a refusal and the commit made again is fenced, never an outage to retry.
        while leased := worker.lease(1):
            worker.execute(leased[0])
        for n, job_id in jobs.items():
            assert app.state.get("order", n).version == 0, "nothing written"
            assert app.state.history("order", n) == []
            [fenced] = [e for e in app.trace(job_id) if e.name == "write.fenced"]
            assert fenced.worker_id == "w" and fenced.data["refused"] == [f"state order:{n} v1"]
            assert app.get_job(job_id).owner_token == "another worker"
        assert_out_of_pipeline(app)
    finally:
        app.close()


# The statement that asks a lock's fencing token in a commit in one round trip
# (``lock_fence_refusing``), by its first line (the loader drops its comments).
LOCK_FENCE = "SELECT rq_require(COALESCE((SELECT fencing_token <= $1 FROM rq_locks"


def locked_writer(app: replayq.App, stolen: str | None = None) -> None:
    """``app``'s job "locked": under ``ctx.lock("account:N")``, a step that writes the
    entity; with ``stolen`` (a conninfo) another holder takes the lock meanwhile (its
    fencing token moves on, as ``lock_acquire`` moves it), before the step commits."""

    @app.job("locked", retry=replayq.Retry(max_attempts=1))
    def locked(ctx: replayq.Context, n: int) -> int:
        with ctx.lock(f"account:{n}", ttl="30s"), ctx.step("write"):
            ctx.state.get("account", n)
            ctx.state.put("account", n, {"n": n})
            if stolen is not None:
                with psycopg.connect(stolen, autocommit=True) as other:
                    other.execute(
                        "UPDATE rq_locks SET owner_token = 'another holder', "
                        "fencing_token = fencing_token + 1, worker_id = 'other', job_id = NULL "
                        "WHERE resource = %s",
                        (f"account:{n}",),
                    )
        return n


def test_a_step_commit_under_a_lock_is_one_round_trip(pg_schema_url: str, tmp_path: Path) -> None:
    """A step that writes under ``ctx.lock`` commits in one round trip too: the write's
    fence (the lock's fencing token no newer than the write's) is sent unread as a
    statement that refuses in the server (RQ003), with the head, the version, the events
    and ``COMMIT``. Two round trips before: the lock's row read first."""
    app = one_connection_app(pg_schema_url)
    locked_writer(app)
    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "locked", {"n": 1})
        block = pipelined_transaction(sent, "INSERT INTO rq_entity_versions")
        kinds = [kind for kind, _ in block]
        assert kinds.count("Bind") == 6, "BEGIN, fence, head, version, events and index, COMMIT"
        statements = [text for kind, text in block if kind == "Parse"]
        assert statements[1] == LOCK_FENCE, "the fence first, as the careful commit asks it"
        assert "-- entity_head_insert_refusing" in statements, statements
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        [version] = app.state.history("account", 1)
        assert (version.data, version.fencing_token) == ({"n": 1}, 1)
        assert_out_of_pipeline(app)
    finally:
        app.close()


# A holder's release of its lock (``lock_release_in_time``), sent unread in a commit in
# one round trip, and the upsert that takes a lock (``lock_acquire``), by their first lines.
LOCK_RELEASE = "-- lock_release_in_time_refusing"
LOCK_ACQUIRE = "INSERT INTO rq_locks"


def test_a_lock_is_taken_in_two_round_trips_and_released_in_one(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """Taking a lock: ``BEGIN`` and the upsert, whose fencing token ``lock.acquired``
    carries (read: a ``Sync``); then the event, fenced by the lease, and ``COMMIT`` (six
    round trips before: the lease asked, the upsert, the pack, its index, ``BEGIN`` and
    ``COMMIT`` each). Releasing it after the step committed: ``BEGIN``, the release that
    refuses unless it freed the holder's live lock, ``lock.released`` and ``COMMIT``
    behind one ``Sync`` (six before: the row read first)."""
    app = one_connection_app(pg_schema_url)
    locked_writer(app)
    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "locked", {"n": 3})
        taken = pipelined_transaction(sent, LOCK_ACQUIRE, syncs=2)
        assert "SELECT id FROM rq_jobs" not in "".join(text for _, text in taken), (
            "the lease is fenced by the event's append, no statement of its own"
        )
        released = pipelined_transaction(sent, LOCK_RELEASE)
        assert "INSERT INTO rq_entity_versions" not in "".join(t for _, t in released)
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        names = [e.name for e in app.trace(job_id) if e.kind == "domain"]
        assert names[0] == "lock.acquired" and names[-1] == "lock.released", names
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_lock_let_go_of_before_its_writes_commit_is_released_in_their_one_round_trip(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """``with ctx.lock(...)`` inside the step that writes under it: the release waits for
    the step's commit and goes into it, after the writes and before the events, all
    behind its one ``Sync``: no round trip of its own."""
    app = one_connection_app(pg_schema_url)

    @app.job("reserve")
    def reserve(ctx: replayq.Context, n: int) -> int:
        with ctx.step("reserve"), ctx.lock("warehouse:1", ttl="30s"):
            ctx.state.put("order", n, {"n": n})
        return n

    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "reserve", {"n": 4})
        block = pipelined_transaction(sent, "INSERT INTO rq_entity_versions")
        statements = [text for kind, text in block if kind == "Parse"]
        at = statements.index
        version = next(t for t in statements if t.startswith("INSERT INTO rq_entity_versions"))
        assert at(LOCK_FENCE) < at(version) < at(LOCK_RELEASE)
        assert at(LOCK_RELEASE) < at("WITH pack AS (") < at("COMMIT"), statements
        assert [text for kind, text in sent if kind == "Parse"].count(LOCK_RELEASE) == 1
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_write_whose_lock_another_holder_took_is_refused_in_the_server_and_rejected(
    pg_schema_url: str, conninfo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another holder takes the lock (its fencing token moves on) between the step's
    ``put`` and its commit: the fence of the one-round-trip commit refuses in the server
    (RQ003) and nothing commits; made again with every answer read, the commit reads the
    lock's row and rejects the write as before (``state.write_rejected`` with both tokens,
    ``StaleFencingTokenError``), the attempt's events those the careful commit alone
    records (``test_context_state``'s, on every backend)."""
    refusals: list[str] = []
    made_error = PostgresTransaction._error

    def error(tx: PostgresTransaction, name: str, exc: psycopg.Error, what: str = "query ") -> Any:
        made = made_error(tx, name, exc, what)
        if isinstance(made, CommitRefused):
            refusals.append(str(made))
        return made

    monkeypatch.setattr(PostgresTransaction, "_error", error)
    app = one_connection_app(pg_schema_url)
    locked_writer(app, stolen=conninfo)
    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "locked", {"n": 2})
        assert len(refusals) == 2, refusals
        assert "lock_fence_refusing: the lock's fencing token moved past" in refusals[0]
        # The lock's release in one round trip refuses too (not this holder's any more):
        # made again, it says ``lock.expired``.
        assert "lock_release_in_time: no row changed" in refusals[1]
        # Made again with every answer read: the lock's row, read at once, rejects the
        # write and ends it (no head, no version sent).
        statements = refused_and_made_again(sent, LOCK_FENCE)
        assert statements[0] == "BEGIN" and statements[1].startswith("SELECT *, (expires_at")
        assert "INSERT INTO rq_entities" not in "".join(statements)
        assert_write_rejected_under_a_taken_lock(app, job_id, "account", 2)
        assert_out_of_pipeline(app)
    finally:
        app.close()


def on_branch(number: int, hlc: int) -> EntityRecord:
    """Version ``number`` of ``order:1`` on the branch ``fork:1``."""
    return EntityRecord(
        "fork:1", "order", "1", number, number - 1 or None, f'{{"v":{number}}}', None, "{}",
        None, None, None, None, float(hlc), hlc,
    )  # fmt: skip


def test_a_branchs_write_is_one_statement_that_refuses_where_the_careful_put_fails(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """In a commit in one round trip a branch's write (``copy_on_write``) is one statement,
    its head not looked up first (``entity_head_put_refusing``): it starts the head where
    the branch has none, moves it from the expected version, and refuses exactly where
    the careful put answers ``False`` (``test_storage_verbs``'s cases, the same order),
    nothing of the refused commit kept. Two round trips before: the head looked up."""
    app = one_connection_app(pg_schema_url)
    storage = app.storage

    def put(row: EntityRecord, expected: int) -> bool:
        """Committed in one round trip (``True``), or refused (``False``)."""
        try:
            with storage.transaction() as tx, tx.pipelined(refusals=True):
                assert tx.entity_put(row, expected, copy_on_write=True)
        except CommitRefused:
            assert_out_of_pipeline(app)
            return False
        return True

    try:
        with storage.transaction() as tx:
            tx.entity_put(structs.replace(on_branch(1, 100), branch="main"), 0)
            tx.entity_put(structs.replace(on_branch(2, 110), branch="main"), 1)
            tx.branch_create(BranchCreate("fork:1", "main", 150, "fork", 0.0))
        with traced_run(app, tmp_path / "trace.txt") as sent:
            assert put(on_branch(3, 160), 2), "started on the base's version 2, read through"
        kinds = [kind for kind, _ in sent]
        statements = [text for kind, text in sent if kind == "Parse"]
        assert kinds.count("Sync") == 1, sent
        assert statements[:2] == ["BEGIN", "-- entity_head_put_refusing"], statements
        assert statements[2].startswith("INSERT INTO rq_entity_versions"), statements
        assert not put(on_branch(3, 161), 2), "the branch's head is at 3 now"
        assert not put(on_branch(4, 162), 0), "a new entity's write, but the branch has its head"
        assert put(on_branch(4, 170), 3)
        with storage.transaction(readonly=True) as tx:
            head = tx.entity_get(EntityGet("fork:1", "order", "1"))
            base = tx.entity_get(EntityGet("main", "order", "1"))
            listed = tx.entity_list(EntityFilter(branch="fork:1", namespace="order", key="1"))
        assert head is not None and (head.version, head.hlc) == (4, 170)
        assert base is not None and (base.version, base.hlc) == (2, 110)
        assert [(v.version, v.hlc) for v in listed] == [(3, 160), (4, 170)]
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_forks_step_commit_on_its_branch_is_one_round_trip(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """A fork writes on its own branch: its step's commit starts the entity's head there in
    the same round trip as the rest (``entity_head_put_refusing``), no lookup first (two
    round trips before); the branch holds the fork's version, production its own."""
    app = one_connection_app(pg_schema_url)

    @app.job("bump")
    def bump(ctx: replayq.Context, n: int) -> int:
        with ctx.step("bump"):
            counter = ctx.state.get("counter", n)
            ctx.state.put("counter", n, {"n": (counter.data or {"n": 0})["n"] + 1})
        return n

    try:
        app.state.put("counter", 1, {"n": 10}, expected_version=0)
        job_id = app.enqueue("bump", {"n": 1})
        worker = Worker(app, worker_id="w")
        (job,) = worker.lease(1)
        worker.execute(job)
        with traced_run(app, tmp_path / "trace.txt") as sent:
            report = fork(app, job_id, from_step="bump")
        block = pipelined_transaction(sent, "INSERT INTO rq_entity_versions")
        statements = [text for kind, text in block if kind == "Parse"]
        assert "-- entity_head_put_refusing" in statements, statements
        assert report.outcome_now.status == "succeeded"
        [forked] = StateStore(app, report.branch).history("counter", 1)
        assert (forked.version, forked.parent_version, forked.data) == (2, 1, {"n": 11})
        assert forked.trace_id == report.trace_id
        assert [v.trace_id for v in app.state.history("counter", 1)][1] == job.trace_id
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_db_write_runs_on_a_connection_out_of_pipeline_mode(
    pg_schema_url: str, conninfo: str
) -> None:
    """``ctx.db_write``'s function is the application's code: its step's commit is not
    pipelined, so its statements answer at once (a row count, an error at the statement
    that made it), and a session that waits inside it is still ended by the server's
    ``idle_in_transaction_session_timeout`` (which a pipeline before its Sync is not)."""
    app = one_connection_app(pg_schema_url)
    seen: list[tuple[Any, int]] = []

    @app.job("tally")
    def tally(ctx: replayq.Context, n: int) -> int:
        with ctx.step("count"):
            ctx.state.get("order", n)
            ctx.state.put("order", n, {"n": n})

            def bump(conn: psycopg.Connection[Any]) -> None:
                cursor = conn.execute("UPDATE app_tally SET hits = hits + 1 WHERE name = 'a'")
                seen.append((conn.info.pipeline_status, cursor.rowcount))

            ctx.db_write(bump)
        return n

    try:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute("CREATE TABLE app_tally (name text PRIMARY KEY, hits int NOT NULL)")
            admin.execute("INSERT INTO app_tally VALUES ('a', 0)")
            job_id = app.enqueue("tally", {"n": 1})
            worker = Worker(app, worker_id="w")
            (job,) = worker.lease(1)
            worker.execute(job)
            assert seen == [(pq.PipelineStatus.OFF, 1)]
            assert app.get_job(job_id).state is JobState.SUCCEEDED
            assert admin.execute("SELECT hits FROM app_tally").fetchone() == (1,)
            assert app.state.get("order", 1).data == {"n": 1}
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_pipelined_step_commit_whose_version_row_fails_commits_nothing(
    pg_schema_url: str, conninfo: str
) -> None:
    """The version row is sent without a wait of its own: its error surfaces at the next
    statement that waits and fails the whole commit, the message naming the statements
    sent unread before it. No head, no version; the attempt's events are kept; the
    connection goes back to the pool out of pipeline mode and the next job's commit on it
    goes through."""
    app = one_connection_app(pg_schema_url)

    @app.job("write", retry=replayq.Retry(max_attempts=1))
    def write(ctx: replayq.Context, n: int) -> int:
        with ctx.step("write"):
            ctx.state.get("order", n)
            ctx.state.put("order", n, {"n": n})
        return n

    try:
        app.storage  # noqa: B018 - opening it migrates the test's schema
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION refuse_version() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'version refused by the test'; END $$"
            )
            admin.execute(
                "CREATE TRIGGER refuse_version BEFORE INSERT ON rq_entity_versions "
                "FOR EACH ROW EXECUTE FUNCTION refuse_version()"
            )
            refused = app.enqueue("write", {"n": 3})
            worker = Worker(app, worker_id="w")
            (job,) = worker.lease(1)
            worker.execute(job)
            failed = app.get_job(refused)
            assert failed.state is JobState.DEAD
            assert "version refused by the test" in (failed.last_error or ""), failed
            assert "entity_version_insert" in (failed.last_error or ""), failed
            assert app.state.get("order", 3).version == 0, "neither head nor version"
            assert app.state.history("order", 3) == []
            names = [e.name for e in app.trace(refused)]
            assert "state.write" in names, "the attempt's events are kept"
            assert_out_of_pipeline(app)
            admin.execute("DROP TRIGGER refuse_version ON rq_entity_versions")
        written = app.enqueue("write", {"n": 4})
        (job,) = worker.lease(1)
        worker.execute(job)
        assert app.get_job(written).state is JobState.SUCCEEDED
        assert app.state.get("order", 4).data == {"n": 4}
        assert_out_of_pipeline(app)
    finally:
        app.close()


def test_an_effects_claim_and_outcome_are_pipelined_and_a_child_jobs_commit_is_not(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """An effect's claim and its outcome commit in one round trip each (replayq's
    statements alone, the claim and the fence refusing in the server); a step
    that enqueues a child job commits out of it (``BEGIN`` as a query of its own), as a
    ``ctx.db_write``'s does. The effect runs once, the child is enqueued once."""
    app = one_connection_app(pg_schema_url)
    sent_mail: list[int] = []

    @app.job("parent")
    def parent(ctx: replayq.Context, n: int) -> int:
        with ctx.step("mail"):
            ctx.effect("mail.send", lambda: sent_mail.append(n), key=f"mail:{n}")
        with ctx.step("spawn"):
            ctx.enqueue("ok", {"n": n})
        return n

    try:
        job_id, _, sent = run_one_traced(app, tmp_path / "trace.txt", "parent", {"n": 5})
        for marker in ("-- idem_claim_refusing", "-- idem_succeed_refusing"):
            block = pipelined_transaction(sent, marker)
            assert "Query" not in [kind for kind, _ in block]
        child = transaction_of(sent, "WITH inserted AS (")
        assert child[0][0] == "Query" and "BEGIN" in child[0][1], child
        assert sent_mail == [5]
        assert app.get_job(job_id).state is JobState.SUCCEEDED
        names = [e.name for e in app.trace(job_id)]
        assert names.count("effect.claimed") == 1 and names.count("effect.succeeded") == 1
        [spawned] = [e for e in app.trace(job_id) if e.name == "child.enqueued"]
        child_id = spawned.data["child_job_id"]
        assert app.get_job(child_id).job_type == "ok"
        assert [j.id for j in app.list_jobs(job_type="ok")] == [child_id], "enqueued once"
        assert_out_of_pipeline(app)
    finally:
        app.close()


# A compare-and-set of a head no entity has: its refusing statement refuses (RQ001).
NO_HEAD = {
    "branch": "main",
    "namespace": "nothing",
    "key": "here",
    "new_version": 2,
    "expected_version": 1,
    "hlc": 1,
}


def answered(tx: Any) -> None:
    """Wait, in a ``PostgresTransaction``'s ``pipelined`` block, until the server's
    answer to what was sent is in the client's socket (before any ``Sync``): the server
    sends a statement's error at once."""
    conn = tx.connection
    conn.pgconn.flush()
    readable, _, _ = select.select([conn.pgconn.socket], [], [], 5.0)
    assert readable, "the server answered nothing in 5 s"


def test_a_refusal_answered_before_the_block_ends_is_a_refusal_not_an_outage(
    pg_schema_url: str,
) -> None:
    """The refusing statement's error is in before the block's ``Sync``: psycopg raises
    the ``COMMIT``'s "pipeline aborted" in its place (the refusal its ``__context__``),
    which ``_first_error`` unwraps: ``CommitRefused``, never a ``StorageError`` (an outage
    to retry). Made to happen every time here; a job's commit meets it by chance."""
    app = one_connection_app(pg_schema_url)
    try:
        app.storage  # noqa: B018 - opening it migrates the test's schema
        for _ in range(3):
            with (
                pytest.raises(CommitRefused, match="entity_head_cas: no row changed"),
                app.storage.transaction() as tx,
                tx.pipelined(refusals=True),
            ):
                assert tx.changed("entity_head_cas", NO_HEAD)
                answered(tx)
            assert_out_of_pipeline(app)
    finally:
        app.close()


def test_a_refusal_raised_by_a_statement_sent_after_it_logs_no_warning(
    pg_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The refusal is in when the block sends its next statement, which raises it
    (``CommitRefused``) inside the block: the aborted pipeline is read to its ``Sync``
    there, so psycopg's exit has nothing to log ("error ignored terminating", a WARNING
    for each such conflict or deduplicated effect otherwise)."""
    app = one_connection_app(pg_schema_url)
    try:
        app.storage  # noqa: B018 - opening it migrates the test's schema
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                with (
                    pytest.raises(CommitRefused),
                    app.storage.transaction() as tx,
                    tx.pipelined(refusals=True),
                ):
                    assert tx.changed("entity_head_cas", NO_HEAD)
                    answered(tx)
                    tx.changed("entity_head_cas", NO_HEAD)  # raises the refusal
                assert_out_of_pipeline(app)
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    finally:
        app.close()
