"""How busy one PostgreSQL drain keeps this machine, beside the drain by two processes:
the ceiling of the issue-13 row "PostgreSQL drain, 2 processes vs 1".

Each run drains ``--jobs`` no-op jobs (enqueued in bulk into a fresh schema) with one,
then two ``replayq worker --burst --concurrency 4`` processes, timed from spawn until
every process exited, and reads the machine's busy time from ``/proc/stat`` over each
drain (every process: the workers, PostgreSQL's backends, anything else running). If
one process's drain keeps B of the machine's N cores busy, two processes can be at most
N / B times as fast, however cheap a job is.

Each run also times the same processes on an empty queue (their start: interpreter,
imports, schema check, and stop), and reports the ratio of the drains after it
(``two_vs_one_after_start``) beside the whole run's (``two_vs_one``, the issue's row);
it is null where a drain is not longer than its start (a queue too small to tell).

    python benchmarks/two_processes.py [--runs 3] [--jobs 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import throughput
from machine import commit, load_average

import replayq

TICK = os.sysconf("SC_CLK_TCK")
CONCURRENCY = 4


def busy_and_total() -> tuple[float, float]:
    """The machine's busy and total CPU seconds so far (all cores; idle and iowait are
    not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    total = sum(fields)
    return (total - fields[3] - fields[4]) / TICK, total / TICK


def drain(processes: int, jobs: int) -> dict[str, float]:
    with throughput.pg_schema("replayq") as url:
        app = throughput.pg_replayq_app(url)
        app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)])
        app.close()
        argv = [*throughput.replayq_command(), "--db", f"{url}&pool_size={CONCURRENCY + 2}"]
        argv += ["worker", "--app", throughput.APP_SPEC, "--burst"]
        argv += ["--concurrency", str(CONCURRENCY)]
        busy, _ = busy_and_total()
        started = time.perf_counter()
        procs = [
            subprocess.Popen(
                argv, cwd=throughput.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            for _ in range(processes)
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"replayq worker failed ({proc.returncode}):\n{err.decode()}")
        wall = time.perf_counter() - started
        busy = busy_and_total()[0] - busy
        states = throughput.pg_replayq_states(url)
        if states.get("succeeded", 0) != jobs:
            raise SystemExit(f"the drain did not finish every job: {states}")
    return {"wall_s": round(wall, 3), "busy_cores": round(busy / wall, 3)}


def after_start_ratio(drain_one: float, drain_two: float) -> float | None:
    """One process's drain after its start over two processes'; None where either is
    not longer than zero (a queue so small that the drain is within the start's noise)."""
    if drain_one <= 0 or drain_two <= 0:
        return None
    return round(drain_one / drain_two, 3)


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    load_before = load_average()
    runs: list[dict[str, Any]] = []
    for _ in range(opts.runs):
        one, two = drain(1, opts.jobs), drain(2, opts.jobs)
        start_one, start_two = drain(1, 0)["wall_s"], drain(2, 0)["wall_s"]
        run = {
            "one": {**one, "start_s": start_one},
            "two": {**two, "start_s": start_two},
            "two_vs_one": round(one["wall_s"] / two["wall_s"], 3),
            "two_vs_one_after_start": after_start_ratio(
                one["wall_s"] - start_one, two["wall_s"] - start_two
            ),
            "ceiling": round(cores / one["busy_cores"], 3),
        }
        runs.append(run)
        if not opts.json:
            print(json.dumps(run), flush=True)
    summary = {
        "benchmark": "two_processes",
        "commit": commit(),
        "load_average": {"before": load_before, "after": load_average()},
        "cores": cores,
        "jobs": opts.jobs,
        "runs": runs,
        "two_vs_one_median": statistics.median(r["two_vs_one"] for r in runs),
        "two_vs_one_after_start_median": median_or_none(
            [r["two_vs_one_after_start"] for r in runs]
        ),
        "ceiling_median": statistics.median(r["ceiling"] for r in runs),
    }
    print(json.dumps(summary, indent=1 if opts.json else None))


if __name__ == "__main__":
    main()
