"""Instructions per job of a worker draining no-op jobs, counted by valgrind's callgrind.

Wall and CPU time on a shared 2-core machine move with whatever else runs there; the
number of instructions a drain executes does not, but it moves with the worker's own
timing: its lease batches and group commits are as large as the pace of the jobs and the
ack window make them, and under callgrind (~50 times slower) the database is fast beside
the worker. Runs of one tree differed by up to 40 % (docs/benchmarks.md, "Round 10 —
PostgreSQL worker CPU"): compare trees over several runs each, interleaved. This counts
them: ``--jobs`` no-op jobs
(``benchmarks/noop_app.py``) are enqueued into a fresh database before valgrind starts,
then one process under ``valgrind --tool=callgrind`` opens the app and drains them with an
in-process ``Worker(app, burst=True)`` (``--concurrency`` executors), and a second process
runs the same worker on the queue the first emptied. Instructions per job = (first -
second) / jobs: the interpreter's start, the imports, the worker's start and stop cancel
out. User space only: the
kernel's work for the database's writes and round trips is not in it.

    python benchmarks/drain_instructions.py [--backend sqlite|postgres] [--jobs 1000]
                                            [--concurrency 4] [--repeat 2] [--json]

Each run takes about a minute (callgrind runs the interpreter ~50 times slower). The tree
measured is the one ``replayq`` is imported from: ``PYTHONPATH=<tree>/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence

import psycopg
from machine import PG_URL, commit, load_average
from noop_app import make_app

import replayq

DRAIN = """
import sys
sys.path.insert(0, {bench!r})
import replayq
from noop_app import make_app
app = make_app({url!r})
stats = replayq.Worker(app, burst=True, concurrency={concurrency}, worker_id="counted").run()
assert stats.succeeded == {jobs}, stats
app.close()
"""


def counted(url: str, jobs: int, concurrency: int) -> int:
    """Instructions callgrind counted in a process that opens the app on ``url`` and runs
    a burst worker, which must find ``jobs`` jobs to do."""
    code = DRAIN.format(
        bench=os.path.dirname(os.path.abspath(__file__)),
        url=url,
        jobs=jobs,
        concurrency=concurrency,
    )
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}/callgrind.out",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def fresh_database(backend: str, directory: str) -> tuple[str, str | None]:
    """A URL of an empty, migrated database, and the PostgreSQL schema to drop after."""
    if backend == "sqlite":
        return f"sqlite:///{directory}/drain.db", None
    schema = f"rq_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a name made here, not from input
    separator = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{separator}options=-csearch_path%3D{schema}", schema


def one_run(backend: str, jobs: int, concurrency: int) -> float:
    with tempfile.TemporaryDirectory() as directory:
        url, schema = fresh_database(backend, directory)
        try:
            app = make_app(url)
            app.schema_upgrade()
            app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)])
            app.close()
            draining = counted(url, jobs, concurrency)
            idle = counted(url, 0, concurrency)  # the same worker on the queue it emptied
            return (draining - idle) / jobs
        finally:
            if schema is not None:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    opts = parser.parse_args(argv)
    runs = [one_run(opts.backend, opts.jobs, opts.concurrency) for _ in range(opts.repeat)]
    figures = {
        "benchmark": "drain_instructions",
        "backend": opts.backend,
        "jobs": opts.jobs,
        "concurrency": opts.concurrency,
        "instructions_per_job": [round(r) for r in runs],
        "replayq": replayq.__file__,
        "commit": commit(),
        "load_average": load_average(),
    }
    if opts.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"{opts.backend}, {opts.jobs} no-op jobs, {opts.concurrency} executors, replayq from")
    print(f"{replayq.__file__} (commit {figures['commit']}):")
    for n, per_job in enumerate(runs, 1):
        print(f"  run {n}: {per_job:,.0f} instructions per job")


if __name__ == "__main__":
    main()
