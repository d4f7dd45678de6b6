"""``App.enqueue_many`` on both backends: jobs/s, CPU seconds and statements per job.

Usage::

    .venv/bin/python benchmarks/enqueue_many.py [--jobs 3000] [--repeat 5] [--json]

Each run enqueues ``--jobs`` no-op jobs in one ``enqueue_many`` call on a fresh
database (a SQLite file; a fresh PostgreSQL schema at ``REPLAYQ_BENCH_PG``, default
the test server). Figures: the median wall rate, this process's CPU seconds per
1,000 jobs, and the statements the storage layer sent per job (each ``execute``, each
multi-row insert, and each ``executemany`` as one: psycopg pipelines it). The last two do
not depend on the machine's load; the load average and commit are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from machine import commit, load_average
from noop_app import make_app

import replayq
from replayq.storage.sql_transaction import SqlTransaction

PG_URL = os.environ.get("REPLAYQ_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


class Counted:
    """Counts the statements ``SqlTransaction`` sends while installed."""

    def __init__(self) -> None:
        self.statements = 0
        self._execute = SqlTransaction.execute
        self._executemany = SqlTransaction.executemany
        # Absent before multi-row inserts existed (a run of an older tree).
        self._execute_rows = getattr(SqlTransaction, "execute_rows", None)

    def __enter__(self) -> Counted:
        counter = self
        execute, executemany, execute_rows = self._execute, self._executemany, self._execute_rows

        def counted_execute(tx: SqlTransaction, name: str, params: Any = None) -> Any:
            counter.statements += 1
            return execute(tx, name, params)

        def counted_executemany(tx: SqlTransaction, name: str, rows: Any) -> None:
            counter.statements += 1
            executemany(tx, name, rows)

        def counted_execute_rows(tx: SqlTransaction, name: str, *args: Any) -> Any:
            counter.statements += 1
            assert execute_rows is not None
            return execute_rows(tx, name, *args)

        if execute_rows is not None:
            SqlTransaction.execute_rows = counted_execute_rows  # type: ignore[method-assign]
        SqlTransaction.execute = counted_execute  # type: ignore[method-assign]
        SqlTransaction.executemany = counted_executemany  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        SqlTransaction.execute = self._execute  # type: ignore[method-assign]
        SqlTransaction.executemany = self._executemany  # type: ignore[method-assign]
        if self._execute_rows is not None:
            SqlTransaction.execute_rows = self._execute_rows  # type: ignore[method-assign]


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'enqueue.db'}"
        return
    import psycopg

    schema = f"rq_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(schema))
            )


def one_run(backend: str, jobs: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, statements) of one ``enqueue_many`` of ``jobs`` jobs."""
    with database(backend) as url:
        migrated = replayq.App(url, auto_migrate=True)
        migrated.storage  # noqa: B018 - PostgreSQL apps never migrate on their own
        migrated.close()
        app = make_app(url)
        app.storage  # noqa: B018 - connect before the clock starts
        requests = [replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)]
        with Counted() as counted:
            cpu, wall = time.process_time(), time.perf_counter()
            ids = app.enqueue_many(requests)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert len(set(ids)) == jobs
        assert app.count_jobs(states=["queued"]) == jobs
        assert len(app.trace(ids[-1])) == 1
        app.close()
    return wall, cpu, counted.statements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {
        "commit": commit(),
        "load_average": " ".join(f"{x:.2f}" for x in load_average()),
        "jobs": args.jobs,
    }
    for backend in args.backend or ["sqlite", "postgres"]:
        runs = [one_run(backend, args.jobs) for _ in range(args.repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        figures[backend] = {
            "jobs_per_second": round(args.jobs / wall),
            "cpu_seconds_per_1000_jobs": round(cpu / args.jobs * 1000, 3),
            "statements_per_job": round(runs[0][2] / args.jobs, 3),
        }
    figures["load_average_after"] = " ".join(f"{x:.2f}" for x in load_average())
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"commit {figures['commit']}, load average {figures['load_average']}")
    for backend in args.backend or ["sqlite", "postgres"]:
        f = figures[backend]
        print(
            f"{backend:9} {f['jobs_per_second']:>7} jobs/s  "
            f"{f['cpu_seconds_per_1000_jobs']:.3f} CPU s/1000 jobs  "
            f"{f['statements_per_job']:.2f} statements/job"
        )
    print(f"load average after: {figures['load_average_after']}")


if __name__ == "__main__":
    main()
