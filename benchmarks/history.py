"""Enqueue and drain beside 1,000,000 finished jobs of history vs an empty database.

Usage::

    .venv/bin/python benchmarks/history.py [--history 1000000] [--jobs 2000] [--repeat 3]
                                           [--backend sqlite|postgres] [--json]

Issue 13's row "drain and enqueue at 1,000,000 finished jobs of history vs an empty
database": the history is generated in SQL (the generator of
``tests/conformance/test_query_plans.py``: one job row and one trace pack per job, mostly
succeeded, 1 in 1,000 dead, 1 in 997 cancelled, none live), not by draining, and
statistics are left to autovacuum as in a real installation (no ``ANALYZE``). Each run
then measures, on the history database and on a fresh empty one, one right after the
other: ``--jobs`` enqueues one by one, ``--jobs`` in one ``enqueue_many``, and a drain of
those by one ``replayq worker --burst`` process (the same worker as ``throughput.py``; the
time the same process takes on the empty queue afterwards is taken off).
The figure is the ratio history / empty of jobs per second (1.0: no slowdown); the two
sides of a ratio run within the same minute, so the machine's load moves both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from machine import commit, load_average
from noop_app import make_app
from throughput import (
    APP_SPEC,
    PG_CONCURRENCY,
    REPO,
    pg_replayq_app,
    pg_schema,
    replayq_command,
    timed,
    timed_process,
)

import replayq

sys.path.insert(0, str(REPO))
from tests.conformance import test_query_plans as plans  # the same generator

OPERATIONS = ("enqueue one by one", "enqueue bulk", "drain")

# The generator's trace ids (``'trace-' || n``) sort after every real one, so each new
# job's entry in ``rq_jobs_trace`` would go in at the left edge of a million-entry index.
# A real history's ids are time-ordered (``new_trace_id``: 48 bits of milliseconds first)
# and older than a new job's; here they are made so, from each job's ``created_at``.
TRACE_ID = {
    "sqlite": "printf('%012x%020x', CAST((:now - 86400 + n * 0.5) * 1000 AS INTEGER), n)",
    "postgresql": "lpad(to_hex(CAST((%(now)s - 86400 + n * 0.5) * 1000 AS bigint)), 12, '0')"
    " || lpad(to_hex(n), 20, '0')",
}


def generate(app: replayq.App, history: int) -> float:
    """Fill ``app``'s database with ``history`` finished jobs; returns the seconds it took."""
    storage: Any = app.storage
    # The whole history is over (its last job created a day before this run), as the
    # generator spreads the jobs half a second apart from a day before ``now``.
    now = time.time() - history * 0.5
    values = {"history": history, "queued": 0, "running": 0, "now": now}
    started = time.perf_counter()
    trace_id = TRACE_ID[storage.dialect]
    with storage.transaction() as tx:
        plans.generate(
            tx.connection,
            storage.dialect,
            values,
            lambda sql: sql.replace("'trace-' || n", trace_id),
        )
    return time.perf_counter() - started


@contextmanager
def database(backend: str, workdir: Path, name: str) -> Iterator[str]:
    """A URL of a fresh, migrated database named ``name``."""
    if backend == "sqlite":
        url = f"sqlite:///{workdir / f'{name}.db'}"
        make_app(url).storage.close()  # create and migrate
        yield url
        return
    with pg_schema(name.replace("-", "_")) as url:
        pg_replayq_app(url).close()
        yield url


def worker_argv(backend: str, url: str) -> list[str]:
    argv = [*replayq_command(), "--db", url, "worker", "--app", APP_SPEC, "--burst"]
    if backend == "postgres":
        argv[2] = f"{url}&pool_size={PG_CONCURRENCY + 2}"
        argv += ["--concurrency", str(PG_CONCURRENCY)]
    return argv


def measure(backend: str, url: str, jobs: int) -> dict[str, float]:
    """Seconds of each operation on the database at ``url`` (``jobs`` new jobs each)."""
    app = make_app(url)
    app.storage  # noqa: B018 - connect before the clock starts
    single = timed(lambda: [app.enqueue("noop", {"n": n}) for n in range(jobs)])
    requests = [replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)]
    bulk = timed(lambda: app.enqueue_many(requests))
    app.close()
    # Both batches are drained (2 * jobs jobs); the same process on the then empty queue
    # (interpreter start, imports, connecting) is taken off, as both sides pay it alike.
    argv = worker_argv(backend, url)
    drain = timed_process(argv, lambda _: None)
    startup = timed_process(argv, lambda _: None)
    return {"enqueue one by one": single, "enqueue bulk": bulk, "drain": (drain - startup) / 2}


def queued_left(url: str) -> int:
    app = replayq.App(url)
    try:
        return app.count_jobs(states=["queued", "running"])
    finally:
        app.close()


def run(backend: str, history: int, jobs: int, repeat: int, workdir: Path) -> dict[str, Any]:
    runs: dict[str, dict[str, list[float]]] = {
        side: {op: [] for op in OPERATIONS} for side in ("history", "empty")
    }
    with database(backend, workdir, f"history-{backend}") as full:
        app = make_app(full)
        generated = generate(app, history)
        app.close()
        print(f"  {history:,} jobs of history generated in {generated:.1f}s", file=sys.stderr)
        for n in range(repeat):
            measured: dict[str, dict[str, float]] = {}
            measured["history"] = measure(backend, full, jobs)
            with database(backend, workdir, f"empty-{backend}-{n}") as empty:
                measured["empty"] = measure(backend, empty, jobs)
                if queued_left(empty):
                    raise SystemExit("the drain of the empty database left jobs behind")
            if queued_left(full):
                raise SystemExit("the drain of the history database left jobs behind")
            for side, seconds in measured.items():
                for op, value in seconds.items():
                    runs[side][op].append(value)
            print(
                f"  run {n + 1}/{repeat}: drain {jobs / measured['history']['drain']:.0f} "
                f"vs {jobs / measured['empty']['drain']:.0f} jobs/s",
                file=sys.stderr,
            )
    figures = []
    for op in OPERATIONS:
        rate = {side: jobs / statistics.median(runs[side][op]) for side in runs}
        figures.append(
            {
                "operation": op,
                "jobs_per_s_history": rate["history"],
                "jobs_per_s_empty": rate["empty"],
                "ratio": rate["history"] / rate["empty"],
            }
        )
    return {"backend": backend, "history_generated_s": generated, "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs (median)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="replayq-history-") as tmp:
        result = run(args.backend, args.history, args.jobs, args.repeat, Path(tmp))
    result |= {
        "history": args.history,
        "jobs": args.jobs,
        "repeat": args.repeat,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": {"before": before, "after": load_average()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.backend}, {args.history:,} jobs of history, {args.jobs:,} jobs per operation")
    for f in result["figures"]:
        print(
            f"  {f['operation']:<20} history {f['jobs_per_s_history']:8.0f} jobs/s   "
            f"empty {f['jobs_per_s_empty']:8.0f} jobs/s   ratio {f['ratio']:.2f}"
        )
    print(f"load average {result['load_average']}; commit {result['commit']}")


if __name__ == "__main__":
    main()
