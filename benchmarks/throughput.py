"""Throughput of replayq beside the storage limit and Huey, from one run on one disk.

Prints enqueue jobs/s (one by one, and bulk) and end-to-end drain jobs/s of
no-op jobs with ONE worker process (a real ``replayq worker --burst``
subprocess, tracing on as always), beside

* a raw ``sqlite3`` claim-and-complete loop with the same durability settings
  that claims one job per transaction (the storage limit), and
* Huey's SQLite storage doing the same work with one worker process,

and the ratios. Every drain is timed from spawning the worker process until it
exits with the queue empty; the time the same process takes on an empty queue
(interpreter start, imports, schema check) is measured too and shown apart.

    python benchmarks/throughput.py [--jobs 5000] [--repeat 3] [--backend sqlite]
                                    [--synchronous NORMAL|FULL] [--dir DIR]

A backend is one ``run_<backend>(options) -> list[Measurement]`` function
registered in ``BACKENDS``; the report and the ratios are shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlite_baselines
from noop_app import make_app

import replayq

REPO = Path(__file__).resolve().parent.parent
APP_SPEC = "benchmarks.noop_app:app"
AIM_VS_RAW = 0.40


@dataclass(frozen=True)
class Options:
    jobs: int
    repeat: int
    synchronous: str
    workdir: Path


@dataclass(frozen=True)
class Measurement:
    """One timed operation: the median of ``runs`` (seconds each)."""

    system: str  # "replayq", "raw", "huey"
    operation: str  # "enqueue one by one", "enqueue bulk", "drain"
    jobs: int
    runs: tuple[float, ...]
    startup: float | None = None  # drains: the same process on an empty queue

    @property
    def seconds(self) -> float:
        return statistics.median(self.runs)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def rate_after_start(self) -> float | None:
        if self.startup is None or self.seconds <= self.startup:
            return None
        return self.jobs / (self.seconds - self.startup)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def timed_process(argv: Sequence[str], expect: Callable[[str], None]) -> float:
    """Seconds from spawning ``argv`` (cwd = repo) to its exit; ``expect(stdout)`` checks it."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stderr}")
    expect(done.stdout)
    return elapsed


def replayq_command() -> list[str]:
    script = Path(sys.executable).with_name("replayq")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from replayq.cli import main; main()"]


# -- SQLite ---------------------------------------------------------------------------------


def sqlite_url(path: Path, synchronous: str) -> str:
    url = f"sqlite:///{path}"
    return url if synchronous == "NORMAL" else f"{url}?synchronous={synchronous}"


def replayq_states(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT state, COUNT(*) FROM rq_jobs GROUP BY state").fetchall()
        events = conn.execute("SELECT name, COUNT(*) FROM rq_events GROUP BY name").fetchall()
    finally:
        conn.close()
    return {**dict(rows), **{f"event {name}": count for name, count in events}}


def sqlite_replayq(opts: Options, run: int) -> tuple[float, float, float, float]:
    """(enqueue one by one s, enqueue bulk s, drain s, empty-queue worker s) for one run."""
    jobs, sync = opts.jobs, opts.synchronous
    single_db = opts.workdir / f"replayq-single-{run}.db"
    app = make_app(sqlite_url(single_db, sync))
    app.storage  # noqa: B018 - open and migrate before the clock starts
    single = timed(lambda: [app.enqueue("noop", {"n": n}) for n in range(jobs)])
    app.close()

    drain_db = opts.workdir / f"replayq-drain-{run}.db"
    url = sqlite_url(drain_db, sync)
    app = make_app(url)
    app.storage  # noqa: B018
    requests = [replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)]
    bulk = timed(lambda: app.enqueue_many(requests))
    app.close()

    worker = [*replayq_command(), "--db", url, "worker", "--app", APP_SPEC, "--burst"]
    drain = timed_process(worker, lambda _: None)
    states = replayq_states(drain_db)
    want = {"succeeded": jobs, "event job.leased": jobs, "event job.succeeded": jobs}
    if any(states.get(key) != count for key, count in want.items()):
        raise SystemExit(f"replayq drain did not finish every job: {states}")
    empty = timed_process(worker, lambda _: None)
    return single, bulk, drain, empty


def sqlite_raw(opts: Options, run: int) -> tuple[float, float]:
    """(drain s, empty-queue loop s) of the raw sqlite3 claim-and-complete loop."""
    path = opts.workdir / f"raw-{run}.db"
    sqlite_baselines.raw_enqueue(str(path), opts.jobs, opts.synchronous)
    argv = [sys.executable, "benchmarks/sqlite_baselines.py", "raw-drain", str(path)]
    argv.append(opts.synchronous)

    def check(count: int) -> Callable[[str], None]:
        def expect(stdout: str) -> None:
            if int(stdout) != count:
                raise SystemExit(f"raw loop completed {stdout.strip()} jobs, not {count}")

        return expect

    drain = timed_process(argv, check(opts.jobs))
    if sqlite_baselines.raw_count_done(str(path)) != opts.jobs:
        raise SystemExit("raw loop left jobs behind")
    empty = timed_process(argv, check(0))
    return drain, empty


def sqlite_huey(opts: Options, run: int) -> tuple[float, float, float]:
    """(enqueue one by one s, drain s, empty-queue loop s) of Huey's SQLite storage."""
    path = opts.workdir / f"huey-{run}.db"
    sqlite_baselines.huey_app(str(path), opts.synchronous).storage.close()  # create tables
    single = sqlite_baselines.huey_enqueue(str(path), opts.jobs, opts.synchronous)
    argv = [sys.executable, "benchmarks/sqlite_baselines.py", "huey-drain", str(path)]
    argv.append(opts.synchronous)
    drain = timed_process(argv, lambda out: None)
    if sqlite_baselines.huey_pending(str(path)) != 0:
        raise SystemExit("huey left tasks behind")
    empty = timed_process(argv, lambda out: None)
    return single, drain, empty


def run_sqlite(opts: Options) -> list[Measurement]:
    rq: list[tuple[float, ...]] = []
    raw: list[tuple[float, ...]] = []
    hu: list[tuple[float, ...]] = []
    for run in range(opts.repeat):
        # Interleaved, so that a slow spell of a shared machine hits all three alike.
        rq.append(sqlite_replayq(opts, run))
        raw.append(sqlite_raw(opts, run))
        hu.append(sqlite_huey(opts, run))
        print(
            f"  run {run + 1}/{opts.repeat}: drain replayq {rq[-1][2]:.2f}s, "
            f"raw {raw[-1][0]:.2f}s, huey {hu[-1][1]:.2f}s",
            file=sys.stderr,
        )

    def col(rows: list[tuple[float, ...]], index: int) -> tuple[float, ...]:
        return tuple(r[index] for r in rows)

    n = opts.jobs
    med = statistics.median
    return [
        Measurement("replayq", "enqueue one by one", n, col(rq, 0)),
        Measurement("replayq", "enqueue bulk", n, col(rq, 1)),
        Measurement("huey", "enqueue one by one", n, col(hu, 0)),
        Measurement("replayq", "drain", n, col(rq, 2), med(col(rq, 3))),
        Measurement("raw", "drain", n, col(raw, 0), med(col(raw, 1))),
        Measurement("huey", "drain", n, col(hu, 1), med(col(hu, 2))),
    ]


BACKENDS: dict[str, Callable[[Options], list[Measurement]]] = {"sqlite": run_sqlite}

LABELS = {
    "replayq": "replayq",
    "raw": "raw sqlite3 loop (1 job/txn)",
    "huey": f"Huey {sqlite_baselines.huey_version()} SqliteStorage",
}


# -- report ---------------------------------------------------------------------------------


def machine(workdir: Path) -> list[tuple[str, str]]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    device = "unknown"
    mounts = Path("/proc/mounts")
    if mounts.exists():
        best = ""
        for line in mounts.read_text().splitlines():
            dev, mount, fstype, *_ = line.split()
            if str(workdir.resolve()).startswith(mount) and len(mount) >= len(best):
                best, device = mount, f"{dev} ({fstype}, mounted at {mount})"
    return [
        ("nproc", str(len(os.sched_getaffinity(0)))),
        ("cpu", cpu),
        ("os", platform.platform()),
        ("python", platform.python_version()),
        ("sqlite", sqlite3.sqlite_version),
        ("huey", sqlite_baselines.huey_version()),
        ("databases in", f"{workdir} on {device}"),
    ]


def report(opts: Options, backend: str, rows: list[Measurement]) -> str:
    lines = [f"## replayq throughput — {backend}, synchronous={opts.synchronous}", ""]
    lines += [f"- {key}: {value}" for key, value in machine(opts.workdir)]
    lines += [
        f"- jobs per measurement: {opts.jobs}; median of {opts.repeat} interleaved run(s)",
        "- drains: ONE worker process, timed from spawn to exit with the queue empty; "
        "'process start' is the same command on an empty queue",
        "",
        "| system | operation | jobs | seconds | jobs/s | process start s | jobs/s after start |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        start = "" if m.startup is None else f"{m.startup:.3f}"
        after = "" if m.rate_after_start is None else f"{m.rate_after_start:,.0f}"
        lines.append(
            f"| {LABELS[m.system]} | {m.operation} | {m.jobs} | {m.seconds:.3f} "
            f"| {m.rate:,.0f} | {start} | {after} |"
        )
    drains = {m.system: m for m in rows if m.operation == "drain"}
    ours = drains["replayq"]
    lines += ["", "| ratio | end to end | after process start | aim |", "|---|---:|---:|---|"]
    for other, aim in (("raw", f"≥ {AIM_VS_RAW:.0%}"), ("huey", "> 100%")):
        base = drains[other]
        after = ""
        if ours.rate_after_start and base.rate_after_start:
            after = f"{ours.rate_after_start / base.rate_after_start:.0%}"
        lines.append(
            f"| replayq drain / {other} drain | {ours.rate / base.rate:.0%} | {after} | {aim} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="sqlite")
    parser.add_argument(
        "--synchronous",
        choices=["NORMAL", "FULL"],
        default="NORMAL",
        help="SQLite synchronous setting for all three systems (replayq default: NORMAL)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="replayq-bench-", dir=args.dir))
    opts = Options(args.jobs, args.repeat, args.synchronous, workdir)
    try:
        rows = BACKENDS[args.backend](opts)
        print(report(opts, args.backend, rows))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
