"""A PostgreSQL claim reads the head of the queue, not the whole queue.

The lease claims in one statement (``job_lease_batch``: ``ORDER BY`` priority, run_at,
id, ``LIMIT``, ``FOR UPDATE SKIP LOCKED``). Without statistics that count the queued jobs
(a new table, or ``ANALYZE`` taken when few were queued) the planner guessed a handful
and, once part of a backlog had been drained, picked a bitmap scan of every queued job
and a sort of them all: each claim of 12 jobs fetched the ~1,500 still queued (round 23's
drain of 3,000 jobs: 87 rows fetched from ``rq_jobs`` a job). The claim now walks the
ready index in its order and stops at its limit.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import psycopg  # a plain import: in CI a missing driver must fail, never skip
import pytest

import replayq
from replayq.storage.params import JobLease

pytestmark = pytest.mark.postgres

BACKLOG = 3000
DRAINED = 1500
LIMIT = 12


def _fetched(tx: Any) -> int:
    """Rows of ``rq_jobs`` fetched through indexes (bitmap heap scans included) so far in
    ``tx``'s transaction (the server's own count, ``pg_stat_xact_user_tables``)."""
    row = tx.connection.execute(
        "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE relname = 'rq_jobs' AND schemaname = current_schema()"
    ).fetchone()
    return int(row[0])


@pytest.mark.parametrize("pipelined", [False, True], ids=["alone", "group_commit"])
def test_a_claim_after_half_a_backlog_drained_fetches_about_its_limit(
    pg_schema_url: str, pipelined: bool
) -> None:
    """Alone (the dispatcher's lease) and in a pipeline (a group commit's refill)."""
    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None:
        return None

    try:
        app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(BACKLOG)])
        # Half drained as workers drain it, a claim and an ack at a time (each leaves its
        # rows' entries in the ready index behind, dead); no ANALYZE, as in a new queue.
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            for first in range(1, DRAINED + 1, LIMIT):
                ids = list(range(first, min(first + LIMIT, DRAINED + 1)))
                conn.execute(
                    "UPDATE rq_jobs SET state = 'running', owner_token = 'x' WHERE id = ANY(%s)",
                    (ids,),
                )
                conn.execute(
                    "UPDATE rq_jobs SET state = 'succeeded', owner_token = NULL,"
                    " finished_at = 1 WHERE id = ANY(%s)",
                    (ids,),
                )
        storage: Any = app.storage
        with storage.transaction() as tx, tx.pipelined() if pipelined else contextlib.nullcontext():
            before = _fetched(tx)
            claim = JobLease(
                worker_id="w",
                owner_token=uuid.uuid4().hex,
                now=time.time() + 1,
                hlc=1,
                limit=LIMIT,
                default_lease_seconds=30.0,
            )
            jobs = tx.job_lease(claim)
            fetched = _fetched(tx) - before
        # The oldest queued jobs, in order: what is claimed did not change.
        assert [job.id for job in jobs] == list(range(DRAINED + 1, DRAINED + 1 + LIMIT))
        # The claimed rows (read again by the UPDATE) and a few more; never the backlog.
        assert fetched <= 4 * LIMIT, f"a claim of {LIMIT} fetched {fetched} rows"
    finally:
        app.close()
