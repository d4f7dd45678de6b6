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
                                            [--prefetch-window S] [--ack-window S]
                                            [--peer pgqueuer]

``--prefetch-window inf --ack-window inf`` has the worker lease its full ``prefetch``
whatever the pace and ack only when its executor has nothing left to run (with the next
lease): the batches and groups are then the same in every run (each run prints its jobs
per lease batch), where at the defaults, under callgrind on a loaded machine, they
followed the timing and a tree's runs differed by a third.

``--peer pgqueuer`` (PostgreSQL) counts PgQueuer's own worker the same way, run for run
interleaved with replayq's: ``--jobs`` jobs bulk-enqueued into a fresh schema before
valgrind starts, then ``postgres_baselines.pgqueuer_drain`` (``PgQueuer.run(mode=drain)``,
its defaults, the psycopg async driver, a no-op entrypoint) under callgrind, less the same
process on the queue it emptied. It prints replayq's instructions per job over PgQueuer's
(medians of the runs): the issue's row "worker CPU seconds per job vs PgQueuer" counted in
instructions. PgQueuer must be importable (``pip install --no-deps --target /tmp/benchdeps
-r benchmarks/requirements.txt``, then ``PYTHONPATH=/tmp/benchdeps:<tree>/src``).

Each run takes about a minute (callgrind runs the interpreter ~50 times slower). The tree
measured is the one ``replayq`` is imported from: ``PYTHONPATH=<tree>/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import uuid
from collections.abc import Sequence

import psycopg
from machine import PG_URL, callgrind_count, commit, load_average
from noop_app import make_app

import replayq

DRAIN = """
import sys
sys.path.insert(0, {bench!r})
import replayq
from noop_app import make_app
app = make_app({url!r})
stats = replayq.Worker(
    app, burst=True, concurrency={concurrency}, worker_id="counted"{extra}
).run()
assert stats.succeeded == {jobs}, stats
app.close()
"""


PEER_DRAIN = {
    "pgqueuer": """
import sys
sys.path.insert(0, {bench!r})
import postgres_baselines
left = postgres_baselines.pgqueuer_drain({url!r})
assert left == 0, left
""",
}


def counted(url: str, jobs: int, concurrency: int, worker_options: dict[str, float]) -> int:
    """Instructions callgrind counted in a process that opens the app on ``url`` and runs
    a burst worker, which must find ``jobs`` jobs to do."""
    code = DRAIN.format(
        bench=os.path.dirname(os.path.abspath(__file__)),
        url=url,
        jobs=jobs,
        concurrency=concurrency,
        # float("inf") has no literal: each option as a float of its text.
        extra="".join(f", {name}=float({str(value)!r})" for name, value in worker_options.items()),
    )
    return callgrind(code)


def callgrind(code: str) -> int:
    """Instructions callgrind counts in ``python -c code`` (user space, every thread)."""
    with tempfile.TemporaryDirectory() as out:
        return callgrind_count([sys.executable, "-c", code], f"{out}/callgrind.out", "the drain")


def fresh_database(backend: str, directory: str) -> tuple[str, str | None]:
    """A URL of an empty, migrated database, and the PostgreSQL schema to drop after."""
    if backend == "sqlite":
        return f"sqlite:///{directory}/drain.db", None
    schema = f"rq_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a name made here, not from input
    separator = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{separator}options=-csearch_path%3D{schema}", schema


def lease_batches(url: str, schema: str | None) -> int:
    """How many lease statements leased the jobs: each batch's lease has one ``leased_at``."""
    query = "SELECT COUNT(DISTINCT leased_at) FROM rq_jobs"
    if schema is None:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return int(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(PG_URL, autocommit=True) as pg:
        row = pg.execute(query.replace("rq_jobs", f"{schema}.rq_jobs")).fetchone()
        return int(row[0]) if row else 0


def one_run(
    backend: str, jobs: int, concurrency: int, worker_options: dict[str, float]
) -> tuple[float, float]:
    """(instructions per job, jobs per lease batch) of one drain."""
    with tempfile.TemporaryDirectory() as directory:
        url, schema = fresh_database(backend, directory)
        try:
            app = make_app(url)
            app.schema_upgrade()
            app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)])
            app.close()
            draining = counted(url, jobs, concurrency, worker_options)
            batches = lease_batches(url, schema)
            # The same worker on the queue it emptied.
            idle = counted(url, 0, concurrency, worker_options)
            return (draining - idle) / jobs, jobs / max(1, batches)
        finally:
            if schema is not None:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")


def peer_run(peer: str, jobs: int) -> float:
    """Instructions per job of ``peer``'s own worker draining ``jobs`` no-op jobs,
    enqueued (in bulk) before valgrind starts; less the same process on the emptied queue."""
    import postgres_baselines

    url, schema = fresh_database("postgres", "")
    try:
        postgres_baselines.pgqueuer_enqueue(url, jobs, bulk=True)
        code = PEER_DRAIN[peer].format(bench=os.path.dirname(os.path.abspath(__file__)), url=url)
        draining = callgrind(code)
        if postgres_baselines.pgqueuer_pending(url) != 0:
            raise SystemExit(f"{peer} left jobs behind")
        idle = callgrind(code)
        return (draining - idle) / jobs
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--prefetch-window",
        type=float,
        default=None,
        help="the worker's prefetch window (inf: always lease the full prefetch, so that "
        "batch sizes do not follow the pace under callgrind and runs of a tree agree)",
    )
    parser.add_argument(
        "--ack-window",
        type=float,
        default=None,
        help="the worker's ack window (inf: successes are acked only when the executor has "
        "nothing left to run, with the next lease: the same groups in every run)",
    )
    parser.add_argument(
        "--peer",
        choices=tuple(PEER_DRAIN),
        default=None,
        help="also count this peer's own worker draining as many no-op jobs (PostgreSQL), "
        "run for run interleaved, and print replayq's instructions per job over its",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    opts = parser.parse_args(argv)
    options = {
        name: value
        for name, value in (
            ("prefetch_window", opts.prefetch_window),
            ("ack_window", opts.ack_window),
        )
        if value is not None
    }
    if opts.peer is not None and opts.backend != "postgres":
        parser.error("--peer needs --backend postgres")
    measured: list[tuple[float, float]] = []
    peer_runs: list[float] = []
    for _ in range(opts.repeat):
        measured.append(one_run(opts.backend, opts.jobs, opts.concurrency, options))
        if opts.peer is not None:
            peer_runs.append(peer_run(opts.peer, opts.jobs))
    runs = [per_job for per_job, _ in measured]
    figures = {
        "benchmark": "drain_instructions",
        "backend": opts.backend,
        "jobs": opts.jobs,
        "concurrency": opts.concurrency,
        "worker_options": options,
        "instructions_per_job": [round(r) for r in runs],
        "jobs_per_lease_batch": [round(b, 2) for _, b in measured],
        **(
            {
                "peer": opts.peer,
                "peer_instructions_per_job": [round(r) for r in peer_runs],
                # Medians of the runs: replayq's instructions per job over the peer's.
                "ratio_to_peer": round(statistics.median(runs) / statistics.median(peer_runs), 3),
            }
            if opts.peer is not None
            else {}
        ),
        "replayq": replayq.__file__,
        "commit": commit(),
        "load_average": load_average(),
    }
    if opts.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"{opts.backend}, {opts.jobs} no-op jobs, {opts.concurrency} executors, replayq from")
    print(f"{replayq.__file__} (commit {figures['commit']}):")
    for n, (per_job, batch) in enumerate(measured, 1):
        print(f"  run {n}: {per_job:,.0f} instructions per job, {batch:.2f} jobs per lease batch")
    if opts.peer is not None:
        each = ", ".join(f"{r:,.0f}" for r in peer_runs)
        print(f"{opts.peer}, instructions per job (runs): {each}")
        print(f"replayq / {opts.peer} (medians): {figures['ratio_to_peer']}")


if __name__ == "__main__":
    main()
