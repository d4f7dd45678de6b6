"""A PostgreSQL worker's CPU a job beside PgQueuer's, user and kernel apart, with its
context switches: the issue-13 worker-CPU row, measured run by run and interleaved.

Each run drains ``--jobs`` no-op jobs (enqueued in bulk into a fresh schema) with one
real ``replayq worker --burst --concurrency 4`` process of each tree given, then the same
jobs with PgQueuer's drain (``postgres_baselines.py pgqueuer-drain``), in alternating
order from run to run. Each process's usage comes from ``wait4`` (user and system CPU,
voluntary and involuntary context switches); the same command on the emptied queue is
run after it, and a job's figures are (drain - empty queue) / jobs: the interpreter's
start, the imports and the schema check cancel out.

    python benchmarks/worker_cpu.py [--runs 8] [--jobs 3000] [--trees DIR[,DIR...]]
                                    [--no-peer] [--json]

``--trees``: source trees to compare (each run with ``PYTHONPATH=<tree>/src``; default:
the tree this file is in). The peers come from ``benchmarks/requirements.txt``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import postgres_baselines
import throughput
from machine import commit, load_average

import replayq

HERE = Path(__file__).resolve().parent
CONCURRENCY = 4
FIGURES = ("user", "sys", "voluntary", "involuntary")


def waited(argv: Sequence[str], tree: Path) -> tuple[dict[str, float], str]:
    """Run ``argv`` in ``tree`` with that tree's replayq first on the path; its usage."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([f"{tree}/src", str(tree), *sys.path]))
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=out, stderr=err)
        _, status, used = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{argv[:6]}... failed:\n{err.read().decode()[-2000:]}")
        text = out.read().decode()
    usage = {
        "wall": time.perf_counter() - started,
        "user": used.ru_utime,
        "sys": used.ru_stime,
        "voluntary": used.ru_nvcsw,
        "involuntary": used.ru_nivcsw,
    }
    return usage, text


def replayq_run(tree: Path, jobs: int) -> tuple[dict[str, float], dict[str, float]]:
    with throughput.pg_schema("replayq") as url:
        app = throughput.pg_replayq_app(url)
        app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)])
        app.close()
        argv = [sys.executable, "-c", "from replayq.cli import main; main()"]
        argv += ["--db", f"{url}&pool_size={CONCURRENCY + 2}", "worker"]
        argv += ["--app", throughput.APP_SPEC, "--burst", "--concurrency", str(CONCURRENCY)]
        drain, _ = waited(argv, tree)
        states = throughput.pg_replayq_states(url)
        if states.get("succeeded") != jobs:
            raise SystemExit(f"{tree}: the drain did not finish every job: {states}")
        empty, _ = waited(argv, tree)
    return drain, empty


def pgqueuer_run(jobs: int) -> tuple[dict[str, float], dict[str, float]]:
    with throughput.pg_schema("pgqueuer") as url:
        postgres_baselines.pgqueuer_enqueue(url, jobs, bulk=True)
        argv = [sys.executable, str(HERE / "postgres_baselines.py"), "pgqueuer-drain", url]
        drain, out = waited(argv, HERE.parent)
        if int(out.strip().splitlines()[-1]) != 0:
            raise SystemExit(f"PgQueuer left jobs behind: {out}")
        empty, _ = waited(argv, HERE.parent)
    return drain, empty


def per_job(drain: dict[str, float], empty: dict[str, float], jobs: int) -> dict[str, float]:
    figures = {key: (drain[key] - empty[key]) / jobs for key in FIGURES}
    figures["cpu"] = figures["user"] + figures["sys"]
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--trees", default=str(HERE.parent), help="comma-separated trees")
    parser.add_argument("--no-peer", action="store_true", help="replayq's trees only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in opts.trees.split(",")]
    for tree in trees:
        compileall.compile_dir(str(tree / "src" / "replayq"), quiet=1)
    runs: dict[str, list[dict[str, float]]] = {}
    load_before = load_average()
    for run in range(opts.runs):
        systems: list[tuple[str, Any]] = [
            (str(tree), lambda tree=tree: replayq_run(tree, opts.jobs)) for tree in trees
        ]
        if not opts.no_peer:
            systems.append(("pgqueuer", lambda: pgqueuer_run(opts.jobs)))
        for name, measure in systems if run % 2 == 0 else reversed(systems):
            figures = per_job(*measure(), opts.jobs)
            runs.setdefault(name, []).append(figures)
            if not opts.json:
                print(f"run {run}: {name}: {figures['cpu'] * 1e6:.0f} µs a job", flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for key in (*FIGURES, "cpu")}
        for name, rows in runs.items()
    }
    summary: dict[str, Any] = {
        "benchmark": "worker_cpu",
        "commit": commit(),
        "load_average": {"before": load_before, "after": load_average()},
        "jobs": opts.jobs,
        "runs": opts.runs,
        "per_job_median": {
            name: {
                "cpu_us": round(m["cpu"] * 1e6, 1),
                "user_us": round(m["user"] * 1e6, 1),
                "sys_us": round(m["sys"] * 1e6, 1),
                "voluntary_switches": round(m["voluntary"], 3),
                "involuntary_switches": round(m["involuntary"], 3),
            }
            for name, m in medians.items()
        },
        "cpu_us_runs": {name: [round(r["cpu"] * 1e6) for r in rows] for name, rows in runs.items()},
    }
    if "pgqueuer" in medians:
        peer = medians["pgqueuer"]["cpu"]
        summary["cpu_ratio_to_pgqueuer"] = {
            str(tree): round(medians[str(tree)]["cpu"] / peer, 3) for tree in trees
        }
    if opts.json:
        print(json.dumps(summary, indent=1))
        return
    for name, m in summary["per_job_median"].items():
        print(f"{name}: {m}")
    for name, ratio in summary.get("cpu_ratio_to_pgqueuer", {}).items():
        print(f"{name} / PgQueuer, CPU a job: {ratio}")


if __name__ == "__main__":
    main()
