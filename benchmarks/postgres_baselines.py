"""The PostgreSQL baselines replayq is measured against, runnable as worker subprocesses.

* ``raw``: the storage limit. A plain psycopg loop over a minimal jobs table that
  claims a batch with ``FOR UPDATE SKIP LOCKED`` (``UPDATE … → running`` in one
  transaction) and completes it in a second one (compare-and-set on the owner
  token). Batch 1 is one job per round trip pair; batch 100 shows what batching
  buys. No trace, no heartbeats, no threads.
* ``pgqueuer``: PgQueuer's own worker (``PgQueuer.run(mode=drain)``, its default
  batch size) on the psycopg async driver.
* ``procrastinate``: Procrastinate's worker (``run_worker(wait=False)``, its default
  concurrency of 1), which exits when the queue is empty.

Each system gets its own schema (``search_path`` in the URL); the throughput
script creates and drops it. Usage (the throughput script does this)::

    python benchmarks/postgres_baselines.py raw-drain           URL BATCH
    python benchmarks/postgres_baselines.py pgqueuer-drain      URL
    python benchmarks/postgres_baselines.py procrastinate-drain URL

A drain prints the number of jobs it completed (or, for the two libraries, the
number left) and exits when the queue is empty.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from importlib.metadata import version
from typing import Any

import psycopg

RAW_SCHEMA = """
CREATE TABLE raw_jobs (
    id             bigserial PRIMARY KEY,
    payload        jsonb NOT NULL,
    state          text  NOT NULL DEFAULT 'queued',
    owner_token    text,
    lease_deadline double precision
);
CREATE INDEX raw_jobs_queued ON raw_jobs (id) WHERE state = 'queued';
"""
RAW_CLAIM = """
UPDATE raw_jobs SET state = 'running', owner_token = %(owner)s,
       lease_deadline = extract(epoch FROM now()) + 60
WHERE id IN (SELECT id FROM raw_jobs WHERE state = 'queued' ORDER BY id
             LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
RETURNING id
"""
RAW_COMPLETE = """
UPDATE raw_jobs SET state = 'done', lease_deadline = NULL
WHERE id = ANY(%(ids)s) AND owner_token = %(owner)s AND state = 'running'
"""


def versions() -> dict[str, str]:
    return {name: version(name) for name in ("psycopg", "pgqueuer", "procrastinate")}


# -- raw ------------------------------------------------------------------------------------


def raw_enqueue(url: str, jobs: int) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(RAW_SCHEMA)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO raw_jobs (payload) VALUES (%s)",
                [(f'{{"n": {n}}}',) for n in range(jobs)],
            )


def raw_drain(url: str, batch: str) -> int:
    done = 0
    with psycopg.connect(url) as conn:
        while True:
            owner = uuid.uuid4().hex
            with conn.transaction():
                ids = [
                    row[0] for row in conn.execute(RAW_CLAIM, {"owner": owner, "batch": int(batch)})
                ]
            if not ids:
                return done
            # (the no-op handler runs here)
            with conn.transaction():
                cur = conn.execute(RAW_COMPLETE, {"ids": ids, "owner": owner})
            done += cur.rowcount


def raw_count_done(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM raw_jobs WHERE state = 'done'").fetchone()
    return int(row[0]) if row else 0


# -- pgqueuer -------------------------------------------------------------------------------


async def _pgqueuer(url: str, work: Any) -> Any:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await work(PsycopgDriver(conn), Queries)


def pgqueuer_enqueue(url: str, jobs: int, *, bulk: bool) -> float:
    """Install PgQueuer's schema, then enqueue; returns the enqueue's seconds."""

    async def work(driver: Any, queries_class: Any) -> float:
        queries = queries_class(driver)
        await queries.install(create_schema=False)
        started = time.perf_counter()
        if bulk:
            await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
        else:
            for _ in range(jobs):
                await queries.enqueue("noop", None)
        return time.perf_counter() - started

    return float(asyncio.run(_pgqueuer(url, work)))


def pgqueuer_pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    return int(row[0]) if row else -1


def pgqueuer_drain(url: str) -> int:
    from pgqueuer import PgQueuer
    from pgqueuer.types import QueueExecutionMode

    async def work(driver: Any, queries_class: Any) -> None:
        pgq = PgQueuer(driver)

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        await pgq.run(mode=QueueExecutionMode.drain)

    asyncio.run(_pgqueuer(url, work))
    return pgqueuer_pending(url)


# -- procrastinate --------------------------------------------------------------------------


def procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    def noop(n: int) -> None:
        return None

    return app


def procrastinate_enqueue(url: str, jobs: int, *, bulk: bool) -> float:
    """Apply Procrastinate's schema, then defer; returns the enqueue's seconds."""
    app = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        task = app.tasks["noop"]
        started = time.perf_counter()
        if bulk:
            task.batch_defer(*({"n": n} for n in range(jobs)))
        else:
            for n in range(jobs):
                task.defer(n=n)
        return time.perf_counter() - started


def procrastinate_pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else -1


def procrastinate_drain(url: str) -> int:
    app = procrastinate_app(url)
    with app.open():
        app.run_worker(wait=False, install_signal_handlers=False)
    return procrastinate_pending(url)


DRAINS = {
    "raw-drain": raw_drain,
    "pgqueuer-drain": pgqueuer_drain,
    "procrastinate-drain": procrastinate_drain,
}

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    command, db_url, *rest = sys.argv[1:]
    print(DRAINS[command](db_url, *rest))
