"""One worker draining no-op jobs in-process: CPU seconds, statements and commits per job.

Usage::

    .venv/bin/python benchmarks/worker_batch.py [--jobs 2000] [--repeat 3]
        [--backend sqlite|postgres] [--concurrency 1 --concurrency 4]
        [--prefetch 0 --prefetch 1 ...] [--json]

Each run enqueues ``--jobs`` no-op jobs on a fresh database (a SQLite file; a fresh
PostgreSQL schema at ``REPLAYQ_BENCH_PG``, default the test server) and drains them
with one in-process ``Worker(burst=True)``. Figures: this process's CPU seconds per
1,000 jobs (all its threads), the statements the storage layer sent per job (each
``execute``, each ``executemany`` as one) and the write transactions per job. The
last two do not depend on the machine's load; the wall rate does, so the load
average and commit are printed beside it. ``--prefetch`` is skipped on a worker
without that setting (a build before batched claims), so the same command measures
before and after.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from typing import Any

from enqueue_many import Counted, database
from machine import commit, load_average
from noop_app import make_app

import replayq
from replayq.storage.sql_transaction import SqlTransaction


class CountedCommits:
    """Counts the write transactions a storage opens while installed."""

    def __init__(self, storage: Any) -> None:
        self.commits = 0
        self._storage = storage
        self._transaction = storage.transaction

    def __enter__(self) -> CountedCommits:
        counter, transaction = self, self._transaction

        def counted(*, readonly: bool = False) -> Any:
            if not readonly:
                counter.commits += 1
            return transaction(readonly=readonly)

        self._storage.transaction = counted
        return self

    def __exit__(self, *exc: object) -> None:
        del self._storage.transaction


def one_run(backend: str, jobs: int, concurrency: int, prefetch: int | None) -> dict[str, float]:
    with database(backend) as url:
        migrated = replayq.App(url, auto_migrate=True)
        migrated.storage  # noqa: B018 - PostgreSQL apps never migrate on their own
        migrated.close()
        app = make_app(url)
        app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)])
        options: dict[str, Any] = {"concurrency": concurrency, "burst": True, "scheduler": False}
        if prefetch is not None:
            options["prefetch"] = prefetch
        worker = replayq.Worker(app, **options)
        with Counted() as counted, CountedCommits(app.storage) as commits:
            cpu, wall = time.process_time(), time.perf_counter()
            stats = worker.run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert stats.succeeded == jobs, stats
        assert app.count_jobs(states=["succeeded"]) == jobs
        app.close()
    return {
        "wall": wall,
        "cpu": cpu,
        "statements": counted.statements / jobs,
        "commits": commits.commits / jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--prefetch", type=int, action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    has_prefetch = "prefetch" in inspect.signature(replayq.Worker).parameters
    prefetches: list[int | None] = list(args.prefetch or [0, 1, 2, 4, 8])
    if not has_prefetch:
        prefetches = [None]
    figures: dict[str, Any] = {
        "commit": commit(),
        "load_average": " ".join(f"{x:.2f}" for x in load_average()),
        "jobs": args.jobs,
        "rows": [],
    }
    assert SqlTransaction  # the statement counter patches it
    for backend in args.backend or ["sqlite", "postgres"]:
        for concurrency in args.concurrency or [1, 4]:
            for prefetch in prefetches:
                runs = [
                    one_run(backend, args.jobs, concurrency, prefetch) for _ in range(args.repeat)
                ]
                row = {
                    "backend": backend,
                    "concurrency": concurrency,
                    "prefetch": prefetch,
                    "jobs_per_second": round(
                        args.jobs / statistics.median(r["wall"] for r in runs)
                    ),
                    "cpu_seconds_per_1000_jobs": round(
                        statistics.median(r["cpu"] for r in runs) / args.jobs * 1000, 3
                    ),
                    "statements_per_job": round(
                        statistics.median(r["statements"] for r in runs), 2
                    ),
                    "commits_per_job": round(statistics.median(r["commits"] for r in runs), 3),
                }
                figures["rows"].append(row)
                if not args.json:
                    print(
                        f"{backend:9} c={concurrency} prefetch={prefetch}: "
                        f"{row['jobs_per_second']:>6} jobs/s  "
                        f"{row['cpu_seconds_per_1000_jobs']:.3f} CPU s/1000 jobs  "
                        f"{row['statements_per_job']:.2f} statements/job  "
                        f"{row['commits_per_job']:.3f} commits/job",
                        flush=True,
                    )
    figures["load_average_after"] = " ".join(f"{x:.2f}" for x in load_average())
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"commit {figures['commit']}, load average {figures['load_average']} -> "
        f"{figures['load_average_after']}"
    )


if __name__ == "__main__":
    main()
