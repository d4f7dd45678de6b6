"""Instructions per job of ``context_overhead``'s traced and plain jobs, counted by callgrind.

The recording-overhead row (issue 11) in instructions, on the path ``context_overhead``
times: a fresh SQLite file, the jobs enqueued (``App.enqueue_many``) in a process of their
own before valgrind starts, then one process under ``valgrind --tool=callgrind`` opens the
app and drains them with an in-process ``Worker(app, burst=True)`` (one executor; prefetch
and ack windows ``inf``, so that its lease batches and group commits do not follow the
pace, which callgrind slows ~50 times). Instructions per job = (the drain of ``--jobs``
jobs - the drain of ``--base`` jobs) / the difference: the interpreter's start, the
imports and the worker's start and stop cancel out. User space only.

``--inline`` counts the inline path instead (lease one job, execute it, on the main
thread, as ``context_overhead --profile`` and ``--cpu`` run it): one thread, so its count
barely moves from run to run, where the worker's threads (heartbeats, acks, the SQLite
watcher's polls) follow the timing, by up to ~±50 K a job between runs of one tree.

Each thread's own count is printed as well (``--separate-threads``): the executor's is
the recording's part, the others are the queue's.

``--backend postgres`` drains in a fresh schema of ``--pg-url`` (default
``$REPLAYQ_TEST_PG``) instead, each drain its own: the count is the client's alone (the
server's work is another process's), which the machine's load does not move where the
timed PostgreSQL row of ``context_overhead`` does.

    python benchmarks/context_instructions.py [--jobs 120] [--base 20] [--inline]
                                              [--sides traced,plain] [--json]
                                              [--backend sqlite|postgres] [--pg-url URL]

The tree measured is the one ``replayq`` is imported from: ``PYTHONPATH=<tree>/src``. Run
``python -m compileall -q <tree>/src`` first (the environment sets
``PYTHONDONTWRITEBYTECODE``: modules without bytecode are compiled in each process; the
difference cancels it, but the counts are larger and slower to take).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from machine import PG_URL, PgSchemas, callgrind_count, commit, load_average

HERE = os.path.dirname(os.path.abspath(__file__))

# Each script opens the benchmark's app on the database, runs its body, and closes it.
PRELUDE = """
import sys
sys.path.insert(0, {bench!r})
from pathlib import Path
import context_overhead as co
import replayq
if {url!r}:
    place = co.Place("postgres", {url!r}, None, {url!r})
else:
    place = co.Place("sqlite", "sqlite:///" + {path!r}, Path({path!r}), "")
app, db = co.open_app({side!r}, place, {lines})
"""
CLOSING = """
app.close()
if db is not None:
    db.close()
"""

# A PostgreSQL schema is migrated explicitly (as ``context_overhead.drain`` does).
SETUP = (
    "import replayq\nif {url!r}:\n    replayq.App({url!r}).schema_upgrade()\n"
    + PRELUDE
    + "app.enqueue_many(co.requests({jobs}))\n"
    + CLOSING
)

WORKER = (
    PRELUDE
    + """
stats = replayq.Worker(
    app, burst=True, worker_id="counted", prefetch_window=float("inf"),
    ack_window=float("inf"),
).run()
assert stats.succeeded == {jobs}, stats
"""
    + CLOSING
)

INLINE = (
    PRELUDE
    + """
app.register_contracts()
worker = replayq.Worker(app, worker_id="counted")
done = 0
while leased := worker.lease(1):
    for job in leased:
        worker.execute(job)
        worker._inflight.pop(job.id, None)
        done += 1
assert done == {jobs}, done
"""
    + CLOSING
)


def counted(
    side: str, jobs: int, lines: int, inline: bool, schemas: PgSchemas | None = None
) -> tuple[int, list[int]]:
    """Instructions of one drain of ``jobs`` fresh jobs: the whole process's, and each
    thread's (in the order callgrind numbers them). With ``schemas``, on PostgreSQL in a
    fresh schema."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "queue.db")
        url = schemas.fresh(f"ci_{side}") if schemas is not None else ""
        fields = {"bench": HERE, "path": path, "url": url, "side": side, "jobs": jobs}
        fields["lines"] = lines
        subprocess.run([sys.executable, "-c", SETUP.format(**fields)], check=True)
        code = (INLINE if inline else WORKER).format(**fields)
        out = os.path.join(directory, "callgrind.out")
        drain = [sys.executable, "-c", code]
        total = callgrind_count(drain, out, f"{side}: the counted drain", separate_threads=True)
        threads = []
        for name in sorted(glob.glob(out + "*")):
            with open(name) as file:
                for line in file:
                    if line.startswith(("summary:", "totals:")):
                        threads.append(int(line.split()[1]))
                        break
        return total, threads


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120, help="jobs of the larger drain")
    parser.add_argument("--base", type=int, default=20, help="jobs of the smaller drain")
    parser.add_argument("--lines", type=int, default=32, help="lines in the call's response")
    parser.add_argument("--sides", default="traced,plain", help="comma-separated sides")
    parser.add_argument("--inline", action="store_true", help="lease + execute on one thread")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (--backend postgres)")
    opts = parser.parse_args(argv)
    if opts.jobs <= opts.base:
        parser.error("--jobs must be more than --base")
    span = opts.jobs - opts.base
    per_job: dict[str, float] = {}
    per_thread: dict[str, list[float]] = {}
    schemas = PgSchemas(opts.pg_url) if opts.backend == "postgres" else None
    try:
        for side in opts.sides.split(","):
            small, small_threads = counted(side, opts.base, opts.lines, opts.inline, schemas)
            large, large_threads = counted(side, opts.jobs, opts.lines, opts.inline, schemas)
            per_job[side] = (large - small) / span
            # A thread started in one drain and not the other (none so far) is left out.
            pairs = zip(small_threads, large_threads, strict=False)
            per_thread[side] = [(b - a) / span for a, b in pairs]
            if not opts.json:
                threads = " ".join(f"{v / 1e6:.3f}" for v in per_thread[side])
                print(
                    f"{side}: {per_job[side] / 1e6:.3f} M instructions a job (threads: {threads})"
                )
    finally:
        if schemas is not None:
            schemas.drop_all()
    if "traced" in per_job and "plain" in per_job:
        overhead = per_job["traced"] / per_job["plain"] - 1
        if not opts.json:
            print(f"traced over plain: {overhead:+.0%}")
    if opts.json:
        figures = {
            "benchmark": "context_instructions",
            "path": "inline" if opts.inline else "worker",
            "backend": opts.backend,
            "commit": commit(),
            "load_average": load_average(),
            "jobs": [opts.base, opts.jobs],
            "instructions_per_job": {side: round(v) for side, v in per_job.items()},
            "instructions_per_job_by_thread": {
                side: [round(v) for v in values] for side, values in per_thread.items()
            },
        }
        print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
