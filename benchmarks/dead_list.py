"""`replayq dead list` (``list_jobs(states=["dead"])``) at 100,000+ jobs of history vs empty.

Usage::

    .venv/bin/python benchmarks/dead_list.py [--history 120000] [--calls 30] [--json]

Each backend gets two fresh databases: one empty but for the same 120 dead jobs, one
with the history of ``tests/conformance/test_query_plans.py`` (generated in one
``INSERT ... SELECT``: mostly succeeded jobs, 1 in 1,000 dead). The figure is the
median time of ``--calls`` calls of the list (and of its count) on each, and their
ratio: the issue's row is "at 100k history vs empty, <= 2x". Timings depend on the
machine's load; the ratio much less (both run in the same minute).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from enqueue_many import database
from machine import commit, load_average

import replayq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conformance import test_query_plans as plans  # the same history


def timed(calls: int, fn: Any) -> float:
    runs = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def measure(backend: str, history: int, calls: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for label, size in (("empty", 0), ("history", history)):
        with database(backend) as url:
            app = replayq.App(url, auto_migrate=True)
            plans.HISTORY = size
            if size:
                plans.history(app)
            else:
                # The same dead jobs as the history holds, and nothing else.
                plans.HISTORY = history
                plans.history(app)
                with app.storage.transaction() as tx:
                    tx.connection.execute("DELETE FROM rq_jobs WHERE state <> 'dead'")
                if backend == "postgres":
                    # An empty table, not one of 120,000 dead tuples a scan still reads.
                    import psycopg

                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("VACUUM FULL rq_jobs")
            dead = app.count_jobs(states=["dead"])
            assert len(app.list_jobs(states=["dead"])) == min(dead, 100)
            figures[f"list_ms_{label}"] = 1000 * timed(
                calls, lambda app=app: app.list_jobs(states=["dead"])
            )
            figures[f"count_ms_{label}"] = 1000 * timed(
                calls, lambda app=app: app.count_jobs(states=["dead"])
            )
            app.close()
    figures["list_ratio"] = figures["list_ms_history"] / figures["list_ms_empty"]
    figures["count_ratio"] = figures["count_ms_history"] / figures["count_ms_empty"]
    return {k: round(v, 3) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=120_000)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {
        "commit": commit(),
        "load_average": " ".join(f"{x:.2f}" for x in load_average()),
        "history": args.history,
    }
    for backend in args.backend or ["sqlite", "postgres"]:
        out[backend] = measure(backend, args.history, args.calls)
    out["load_average_after"] = " ".join(f"{x:.2f}" for x in load_average())
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"commit {out['commit']}, load average {out['load_average']}")
    for backend in args.backend or ["sqlite", "postgres"]:
        f = out[backend]
        print(
            f"{backend:9} dead list {f['list_ms_empty']:.2f} ms empty, "
            f"{f['list_ms_history']:.2f} ms at {args.history:,} ({f['list_ratio']:.1f}x); "
            f"count {f['count_ms_empty']:.2f} / {f['count_ms_history']:.2f} ms "
            f"({f['count_ratio']:.1f}x)"
        )
    print(f"load average after: {out['load_average_after']}")


if __name__ == "__main__":
    main()
