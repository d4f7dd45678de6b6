"""A worker's group commit on PostgreSQL in psycopg's pipeline mode (``pipelined``).

Real PostgreSQL; the round trips are counted in libpq's own protocol trace (``PQtrace``)
of the one pooled connection (``pool_size=1``): each ``Sync`` the client sends is a wait
for the server, as is each simple ``Query``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import pq

import replayq
from replayq import JobState, Worker
from replayq.storage.postgres import parse_postgres_url

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
    """The frontend messages the pool's connection sends in the block (after it)."""
    sent: list[str] = []
    with path.open("w") as out:
        with the_connection(app) as conn:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            with the_connection(app) as conn:
                conn.pgconn.untrace()
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if fields[0] == "F" and len(fields) > 2:
            sent.append(fields[2].split(" ")[0])


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
