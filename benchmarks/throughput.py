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
    python benchmarks/throughput.py --backend postgres [--jobs 3000] [--repeat 1]
    python benchmarks/throughput.py --backend sqlite|postgres --idle-only [--idle-poll 30]
    python benchmarks/throughput.py --backend sqlite|postgres --enqueue-only [--repeat 3]
    (any of them with --json: the figures, load average and commit as JSON)

``--backend postgres`` runs against ``$REPLAYQ_BENCH_PG`` (default: the local server,
database ``test``) and measures replayq with 1 and 2 worker processes beside a raw
psycopg ``SKIP LOCKED`` loop (batch 1 and 100), PgQueuer and Procrastinate
(``postgres_baselines.py``). Both backends also measure replayq's enqueue→start
latency with one idle worker process (LISTEN on PostgreSQL, the file watch on SQLite)
and that worker's CPU while idle. On PostgreSQL the drains' worker CPU per job is
measured too (``getrusage`` of the waited worker processes), whole and beyond the same
process's empty-queue run, for replayq (1 process), PgQueuer and Procrastinate; the JSON
also splits it into user and kernel CPU and counts the context switches per job.

A backend is one ``run_<backend>(options) -> list[Measurement]`` function
registered in ``BACKENDS``; the report and the ratios are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import postgres_baselines
import sqlite_baselines
from machine import compile_package, machine
from noop_app import make_app

import replayq
from replayq.storage import packs

REPO = Path(__file__).resolve().parent.parent
APP_SPEC = "benchmarks.noop_app:app"
AIM_VS_RAW = 0.40
IDLE_PROBES = 30
IDLE_CPU_SECONDS = 3.0


@dataclass(frozen=True)
class Options:
    jobs: int
    repeat: int
    synchronous: str
    workdir: Path
    idle_poll: float = 30.0


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


def children_cpu() -> float:
    """User + system CPU seconds of every child process waited for so far (``getrusage``):
    the difference around a drain is its worker processes' CPU."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@dataclass(frozen=True)
class Usage:
    """What waited-for child processes used (``getrusage(RUSAGE_CHILDREN)``), or the
    difference of two such readings: CPU seconds in user space and in the kernel, and
    context switches, voluntary (a wait: a lock, the GIL, a socket) and involuntary
    (preempted)."""

    user: float
    sys: float
    voluntary: int
    involuntary: int

    @property
    def cpu(self) -> float:
        return self.user + self.sys

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.user - other.user,
            self.sys - other.sys,
            self.voluntary - other.voluntary,
            self.involuntary - other.involuntary,
        )


def children_usage() -> Usage:
    """``Usage`` of every child process waited for so far: the difference around a
    drain is its worker processes'."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Usage(used.ru_utime, used.ru_stime, used.ru_nvcsw, used.ru_nivcsw)


def usage_rows(system: str, jobs: int, drain: Usage, empty: Usage) -> list[Measurement]:
    """A drain's worker CPU (whole) and its parts (user, kernel, switches) as report rows,
    each with the same command's empty-queue run as its ``startup``."""
    return [
        Measurement(system, "drain, CPU", jobs, (drain.cpu,), empty.cpu),
        *(
            Measurement(
                system,
                operation,
                jobs,
                (float(getattr(drain, field)),),
                float(getattr(empty, field)),
            )
            for operation, field in USAGE_OPERATIONS.items()
        ),
    ]


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
    packs.register_sqlite(conn)  # rq_events reads deflated packs through rq_pack_json
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
        *idle_rows(sqlite_replayq_latency(opts)),
    ]


# -- PostgreSQL -----------------------------------------------------------------------------

PG_URL = os.environ.get("REPLAYQ_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
PG_CONCURRENCY = 4  # executor threads per replayq worker process


@contextmanager
def pg_schema(system: str) -> Iterator[str]:
    """A URL whose search_path is a new schema for ``system``, dropped afterwards."""
    import psycopg
    from psycopg import sql

    schema = f"bench_{system}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def pg_replayq_states(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT state, count(*) FROM rq_jobs GROUP BY state").fetchall()
        events = conn.execute("SELECT name, count(*) FROM rq_events GROUP BY name").fetchall()
    return {**dict(rows), **{f"event {name}": count for name, count in events}}


def pg_replayq_app(url: str) -> replayq.App:
    migrated = replayq.App(url, auto_migrate=True)
    migrated.storage  # noqa: B018 - workers on PostgreSQL never migrate on their own
    migrated.close()
    app = make_app(url)
    app.storage  # noqa: B018 - connect before the clock starts
    return app


def pg_replayq_drain(
    opts: Options, processes: int
) -> tuple[float, float, float, float, Usage, Usage]:
    """(enqueue one by one s, enqueue bulk s, drain s, empty-queue s, the drain's and the
    empty queue's worker ``Usage``), ``processes`` workers."""
    with pg_schema("replayq") as url:
        app = pg_replayq_app(url)
        single = timed(lambda: [app.enqueue("noop", {"n": n}) for n in range(opts.jobs)])
        with app.storage.transaction() as tx:
            tx.connection.execute("TRUNCATE rq_jobs, rq_trace, rq_trace_resources")
        requests = [replayq.EnqueueRequest("noop", {"n": n}) for n in range(opts.jobs)]
        bulk = timed(lambda: app.enqueue_many(requests))
        app.close()
        worker_url = f"{url}&pool_size={PG_CONCURRENCY + 2}"
        argv = [*replayq_command(), "--db", worker_url, "worker", "--app", APP_SPEC]
        argv += ["--burst", "--concurrency", str(PG_CONCURRENCY)]

        def drain_with_workers() -> float:
            started = time.perf_counter()
            procs = [
                subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for _ in range(processes)
            ]
            for proc in procs:
                _, err = proc.communicate()
                if proc.returncode != 0:
                    raise SystemExit(f"replayq worker failed ({proc.returncode}):\n{err.decode()}")
            return time.perf_counter() - started

        cpu = children_usage()
        drain = drain_with_workers()
        cpu, empty_cpu = children_usage() - cpu, children_usage()
        states = pg_replayq_states(url)
        want = {"succeeded": opts.jobs, "event job.succeeded": opts.jobs}
        if any(states.get(key) != count for key, count in want.items()):
            raise SystemExit(f"replayq drain did not finish every job: {states}")
        empty = drain_with_workers()
        empty_cpu = children_usage() - empty_cpu
    return single, bulk, drain, empty, cpu, empty_cpu


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, from ``/proc`` (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replayq_idle_pickup(url: str, app: replayq.App, poll: float) -> tuple[list[float], float]:
    """(seconds from just before ``enqueue`` to the job's lease, idle worker CPU fraction).

    One idle ``replayq worker`` process polling every ``poll`` seconds: with a poll of
    30 s, a pickup faster than that came through the backend's wake-up (LISTEN on
    PostgreSQL, the file watch on SQLite). The lease time is the worker's
    ``job.leased`` event (same machine, same wall clock). The CPU fraction is the
    worker's CPU seconds over ``IDLE_CPU_SECONDS`` of an empty queue.
    """
    mark = "%s" if app.storage.dialect == "postgresql" else "?"
    leased_sql = f"SELECT ts FROM rq_events WHERE job_id = {mark} AND name = 'job.leased'"
    argv = [*replayq_command(), "--db", url, "worker", "--app", APP_SPEC]
    argv += ["--poll-interval", str(poll), "--grace", "1"]
    worker = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latencies: list[float] = []
    try:
        for n in range(IDLE_PROBES + 1):
            time.sleep(0.1)  # idle between probes
            enqueued = time.time()
            job_id = app.enqueue("noop", {"n": n})
            leased = None
            deadline = time.monotonic() + (60 if n == 0 else 10)
            while leased is None and time.monotonic() < deadline:
                with app.storage.transaction(readonly=True) as tx:
                    row = tx.connection.execute(leased_sql, [job_id]).fetchone()
                leased = row[0] if row else None
                time.sleep(0.001)
            if leased is None:
                raise SystemExit(f"latency probe {n} was not picked up in time")
            if n:  # the first one waits for the worker to start
                latencies.append(float(leased) - enqueued)
        time.sleep(0.5)
        cpu = process_cpu_seconds(worker.pid)
        time.sleep(IDLE_CPU_SECONDS)
        idle_cpu = (process_cpu_seconds(worker.pid) - cpu) / IDLE_CPU_SECONDS
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(20)
    return latencies, idle_cpu


def pg_replayq_latency(opts: Options) -> tuple[list[float], float]:
    with pg_schema("replayq_latency") as url:
        app = pg_replayq_app(url)
        try:
            return replayq_idle_pickup(url, app, opts.idle_poll)
        finally:
            app.close()


def sqlite_replayq_latency(opts: Options) -> tuple[list[float], float]:
    url = sqlite_url(opts.workdir / "replayq-latency.db", opts.synchronous)
    app = make_app(url)
    app.storage  # noqa: B018 - create the schema before the worker starts
    try:
        return replayq_idle_pickup(url, app, opts.idle_poll)
    finally:
        app.close()


def pg_raw_drain(opts: Options, batch: int) -> tuple[float, float]:
    """(drain s, empty-queue s) of the raw loop claiming ``batch`` jobs at a time."""
    with pg_schema(f"raw{batch}") as url:
        postgres_baselines.raw_enqueue(url, opts.jobs)
        argv = [sys.executable, "benchmarks/postgres_baselines.py", "raw-drain", url, str(batch)]

        def expect(count: int) -> Callable[[str], None]:
            def check(stdout: str) -> None:
                if int(stdout) != count:
                    raise SystemExit(f"raw loop completed {stdout.strip()} jobs, not {count}")

            return check

        drain = timed_process(argv, expect(opts.jobs))
        if postgres_baselines.raw_count_done(url) != opts.jobs:
            raise SystemExit("raw loop left jobs behind")
        empty = timed_process(argv, expect(0))
    return drain, empty


def pg_library(opts: Options, system: str) -> tuple[float, float, float, float, Usage, Usage]:
    """(enqueue one by one s, enqueue bulk s, drain s, empty-queue s, the drain's and the
    empty queue's worker ``Usage``): pgqueuer, procrastinate."""
    enqueue = {
        "pgqueuer": postgres_baselines.pgqueuer_enqueue,
        "procrastinate": postgres_baselines.procrastinate_enqueue,
    }[system]
    with pg_schema(system) as url:
        single = enqueue(url, opts.jobs, bulk=False)
    with pg_schema(system) as url:
        bulk = enqueue(url, opts.jobs, bulk=True)
        argv = [sys.executable, "benchmarks/postgres_baselines.py", f"{system}-drain", url]

        def expect(stdout: str) -> None:
            if int(stdout.strip().splitlines()[-1]) != 0:
                raise SystemExit(f"{system} left {stdout.strip()} jobs behind")

        cpu = children_usage()
        drain = timed_process(argv, expect)
        cpu, empty_cpu = children_usage() - cpu, children_usage()
        empty = timed_process(argv, expect)
        empty_cpu = children_usage() - empty_cpu
    return single, bulk, drain, empty, cpu, empty_cpu


def run_postgres(opts: Options) -> list[Measurement]:
    """One run of each system against the local server, in dedicated schemas."""
    n = opts.jobs
    rows: list[Measurement] = []
    for run in range(opts.repeat):
        one = pg_replayq_drain(opts, 1)
        two = pg_replayq_drain(opts, 2)
        raw1, raw100 = pg_raw_drain(opts, 1), pg_raw_drain(opts, 100)
        pgq = pg_library(opts, "pgqueuer")
        proc = pg_library(opts, "procrastinate")
        print(
            f"  run {run + 1}/{opts.repeat}: drain replayq {one[2]:.2f}s / {two[2]:.2f}s, "
            f"raw {raw1[0]:.2f}s / {raw100[0]:.2f}s, pgqueuer {pgq[2]:.2f}s, "
            f"procrastinate {proc[2]:.2f}s",
            file=sys.stderr,
        )
        rows += [
            Measurement("replayq", "enqueue one by one", n, (one[0],)),
            Measurement("replayq", "enqueue bulk", n, (one[1],)),
            Measurement("pgqueuer", "enqueue one by one", n, (pgq[0],)),
            Measurement("pgqueuer", "enqueue bulk", n, (pgq[1],)),
            Measurement("procrastinate", "enqueue one by one", n, (proc[0],)),
            Measurement("procrastinate", "enqueue bulk", n, (proc[1],)),
            Measurement("replayq", "drain", n, (one[2],), one[3]),
            Measurement("replayq", "drain, 2 processes", n, (two[2],), two[3]),
            Measurement("raw1", "drain", n, (raw1[0],), raw1[1]),
            Measurement("raw100", "drain", n, (raw100[0],), raw100[1]),
            Measurement("pgqueuer", "drain", n, (pgq[2],), pgq[3]),
            Measurement("procrastinate", "drain", n, (proc[2],), proc[3]),
            # The worker processes' CPU seconds and context switches (``startup``: on the
            # empty queue).
            *usage_rows("replayq", n, one[4], one[5]),
            *usage_rows("pgqueuer", n, pgq[4], pgq[5]),
            *usage_rows("procrastinate", n, proc[4], proc[5]),
        ]
    return merge_runs(rows) + idle_rows(pg_replayq_latency(opts))


def cpu_timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of ``fn()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def replayq_enqueue_pair(url: str, jobs: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((wall, CPU) s of ``jobs`` ``enqueue`` calls, (wall, CPU) s of one ``enqueue_many``)
    on an empty queue each; ``url`` is migrated already."""
    app = make_app(url)
    app.storage  # noqa: B018 - connect before the clock starts
    single = cpu_timed(lambda: [app.enqueue("noop", {"n": n}) for n in range(jobs)])
    with app.storage.transaction() as tx:
        tx.connection.execute("DELETE FROM rq_trace_resources")
        tx.connection.execute("DELETE FROM rq_trace")
        tx.connection.execute("DELETE FROM rq_jobs")
    requests = [replayq.EnqueueRequest("noop", {"n": n}) for n in range(jobs)]
    bulk = cpu_timed(lambda: app.enqueue_many(requests))
    app.close()
    return single, bulk


def run_enqueue_only(backend: str, opts: Options) -> list[Measurement]:
    """The enqueue rows alone, interleaved with the peers' in each run; replayq's CPU
    seconds (this process: the load does not change them) as rows of their own."""
    n = opts.jobs
    rows: list[Measurement] = []
    for run in range(opts.repeat):
        if backend == "sqlite":
            path = opts.workdir / f"replayq-enqueue-{run}.db"
            url = sqlite_url(path, opts.synchronous)
            make_app(url).close()
            single, bulk = replayq_enqueue_pair(url, n)
            huey_db = opts.workdir / f"huey-enqueue-{run}.db"
            peers = [
                (
                    "huey",
                    "enqueue one by one",
                    sqlite_baselines.huey_enqueue(str(huey_db), n, opts.synchronous),
                )
            ]
        else:
            with pg_schema("replayq") as url:
                pg_replayq_app(url).close()
                single, bulk = replayq_enqueue_pair(url, n)
            peers = []
            for system, enqueue in (
                ("pgqueuer", postgres_baselines.pgqueuer_enqueue),
                ("procrastinate", postgres_baselines.procrastinate_enqueue),
            ):
                for bulk_peer, operation in ((False, "enqueue one by one"), (True, "enqueue bulk")):
                    with pg_schema(system) as peer_url:
                        peers.append((system, operation, enqueue(peer_url, n, bulk=bulk_peer)))
        rows += [
            Measurement("replayq", "enqueue one by one", n, (single[0],)),
            Measurement("replayq", "enqueue bulk", n, (bulk[0],)),
            Measurement("replayq", "enqueue one by one, CPU", n, (single[1],)),
            Measurement("replayq", "enqueue bulk, CPU", n, (bulk[1],)),
            *(Measurement(system, op, n, (seconds,)) for system, op, seconds in peers),
        ]
        print(f"  run {run + 1}/{opts.repeat} done", file=sys.stderr)
    return merge_runs(rows)


def enqueue_lines(rows: Sequence[Measurement]) -> list[str]:
    """The enqueue rows as a table, with replayq / peer ratios and CPU µs per enqueue."""
    lines = [
        "| system | operation | jobs/s | replayq / it | replayq CPU µs per job |",
        "|---|---|---:|---:|---:|",
    ]
    ours = {m.operation: m for m in rows if m.system == "replayq"}
    for m in rows:
        if m.operation.endswith(", CPU"):
            continue
        cpu = ours.get(f"{m.operation}, CPU")
        mine = ours[m.operation]
        ratio = "" if m.system == "replayq" else f"{mine.rate / m.rate:.2f}"
        cpu_text = f"{cpu.seconds / cpu.jobs * 1e6:.0f}" if m.system == "replayq" and cpu else ""
        lines.append(
            f"| {LABELS[m.system]} | {m.operation} | {m.rate:,.0f} | {ratio} | {cpu_text} |"
        )
    return lines


def idle_rows(measured: tuple[list[float], float]) -> list[Measurement]:
    """The idle pickup probes and the idle worker's CPU fraction as report rows."""
    latencies, idle_cpu = measured
    return [
        Measurement("replayq", "enqueue→start latency", 1, tuple(latencies)),
        Measurement("replayq", "idle worker CPU fraction", 1, (idle_cpu,)),
    ]


def merge_runs(rows: list[Measurement]) -> list[Measurement]:
    """One row per (system, operation), its runs pooled: the median is over all of them."""
    merged: dict[tuple[str, str], Measurement] = {}
    for m in rows:
        key = (m.system, m.operation)
        if key in merged:
            before = merged[key]
            startup = None
            if before.startup is not None and m.startup is not None:
                startup = (before.startup + m.startup) / 2
            m = Measurement(m.system, m.operation, m.jobs, before.runs + m.runs, startup)
        merged[key] = m
    return list(merged.values())


BACKENDS: dict[str, Callable[[Options], list[Measurement]]] = {
    "sqlite": run_sqlite,
    "postgres": run_postgres,
}

LABELS = {
    "replayq": "replayq",
    "raw": "raw sqlite3 loop (1 job/txn)",
    "huey": f"Huey {sqlite_baselines.huey_version()} SqliteStorage",
    "raw1": "raw psycopg SKIP LOCKED loop, batch 1",
    "raw100": "raw psycopg SKIP LOCKED loop, batch 100",
    "pgqueuer": "PgQueuer (defaults, psycopg driver)",
    "procrastinate": "Procrastinate (defaults)",
}


# -- report ---------------------------------------------------------------------------------


def report(opts: Options, backend: str, rows: list[Measurement]) -> str:
    lines = [f"## replayq throughput — {backend}, synchronous={opts.synchronous}", ""]
    lines += [
        f"- {key}: {value}"
        for key, value in machine(opts.workdir, [("huey", sqlite_baselines.huey_version())])
    ]
    lines += [
        f"- jobs per measurement: {opts.jobs}; median of {opts.repeat} interleaved run(s)",
        "- drains: ONE worker process, timed from spawn to exit with the queue empty; "
        "'process start' is the same command on an empty queue",
        "",
        "| system | operation | jobs | seconds | jobs/s | process start s | jobs/s after start |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        if m.operation in IDLE_OPERATIONS:
            continue
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


def pg_server_version() -> str:
    import psycopg

    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def report_postgres(opts: Options, rows: list[Measurement], load: tuple[str, str]) -> str:
    lines = ["## replayq throughput — postgres", ""]
    facts = [
        kv
        for kv in machine(opts.workdir, [("huey", sqlite_baselines.huey_version())])
        if kv[0] in ("nproc", "cpu", "os", "python")
    ]
    facts += [
        ("server", f"PostgreSQL {pg_server_version()} at {PG_URL} (local, shared)"),
        *((name, v) for name, v in postgres_baselines.versions().items()),
        ("load average (1, 5, 15 min)", f"before {load[0]}; after {load[1]}"),
    ]
    lines += [f"- {key}: {value}" for key, value in facts]
    lines += [
        f"- jobs per measurement: {opts.jobs}; median of {opts.repeat} run(s); one schema "
        "per system and run, dropped afterwards",
        f"- replayq drains: `replayq worker --burst --concurrency {PG_CONCURRENCY}` "
        "processes, tracing on, timed from spawn until every process exited with the "
        "queue empty (process start included, as for every other system)",
        "- 'empty-queue s': the same drain command(s) on the emptied queue (process start, "
        "connect, finding the queue empty, exit); 'jobs/s after start' subtracts it",
        "",
        "| system | operation | jobs | seconds | jobs/s | empty-queue s | jobs/s after start |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        if m.operation in (*IDLE_OPERATIONS, *USAGE_OPERATIONS) or m.operation.endswith(", CPU"):
            continue
        start = "" if m.startup is None else f"{m.startup:.3f}"
        after = "" if m.rate_after_start is None else f"{m.rate_after_start:,.0f}"
        lines.append(
            f"| {LABELS[m.system]} | {m.operation} | {m.jobs} | {m.seconds:.3f} "
            f"| {m.rate:,.0f} | {start} | {after} |"
        )
    drains = {m.system: m for m in rows if m.operation == "drain"}
    ours = drains["replayq"]
    lines += [
        "",
        "| ratio (1 process each) | end to end | after process start | aim |",
        "|---|---:|---:|---|",
    ]
    for other, aim in (
        ("pgqueuer", "≥ 100%"),
        ("procrastinate", "≥ 500%"),
        ("raw1", ""),
        ("raw100", ""),
    ):
        base = drains[other]
        after = ""
        if ours.rate_after_start and base.rate_after_start:
            after = f"{ours.rate_after_start / base.rate_after_start:.0%}"
        lines.append(
            f"| replayq / {LABELS[other]} | {ours.rate / base.rate:.0%} | {after} | {aim} |"
        )
    return "\n".join(lines + cpu_lines(rows) + idle_lines(rows, opts.idle_poll, "LISTEN", 5))


def cpu_lines(rows: Sequence[Measurement]) -> list[str]:
    """The drains' worker CPU per job (whole process, and beyond its empty-queue run)."""
    cpu = {m.system: m for m in rows if m.operation == "drain, CPU"}
    if "replayq" not in cpu:
        return []
    ours = cpu["replayq"]
    lines = [
        "",
        "| worker CPU per job (1 process) | µs, whole process | µs, beyond process start "
        "| replayq / it (beyond start) |",
        "|---|---:|---:|---:|",
    ]
    for system, m in cpu.items():
        ratio = "" if system == "replayq" else f"{cpu_after_start(ours) / cpu_after_start(m):.2f}"
        lines.append(
            f"| {LABELS[system]} | {m.seconds / m.jobs * 1e6:.0f} "
            f"| {cpu_after_start(m) * 1e6:.0f} | {ratio} |"
        )
    return lines


def cpu_after_start(m: Measurement) -> float:
    """CPU seconds per job of a drain beyond its empty-queue run (process start, imports)."""
    return (m.seconds - (m.startup or 0.0)) / m.jobs


IDLE_OPERATIONS = ("enqueue→start latency", "idle worker CPU fraction")
# A drain's worker ``Usage`` in parts beside its "drain, CPU" row: operation → field.
USAGE_OPERATIONS = {
    "drain, user CPU": "user",
    "drain, system CPU": "sys",
    "drain, voluntary switches": "voluntary",
    "drain, involuntary switches": "involuntary",
}


def idle_lines(rows: Sequence[Measurement], poll: float, wake: str, aim_ms: int) -> list[str]:
    """The idle pickup (p50, p90, max) and the idle worker's CPU, as report lines."""
    by_operation = {m.operation: m for m in rows if m.operation in IDLE_OPERATIONS}
    if not by_operation:
        return []
    ms = sorted(r * 1000 for r in by_operation["enqueue→start latency"].runs)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    cpu = by_operation["idle worker CPU fraction"].runs[0]
    how = f"so {wake}" if poll >= 1 else "wake-up and poll together"
    return [
        "",
        f"enqueue→start latency, one idle worker process (poll every {poll:g} s, {how}), "
        f"{len(ms)} probes 0.1 s apart: p50 {statistics.median(ms):.1f} ms, "
        f"p90 {p90:.1f} ms, max {ms[-1]:.1f} ms (aim: p50 < {aim_ms} ms); "
        f"the idle worker's CPU over {IDLE_CPU_SECONDS:g} s: {cpu:.1%} of a core",
    ]


def git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def as_json(
    backend: str, opts: Options, rows: Sequence[Measurement], load: tuple[str, str]
) -> dict[str, object]:
    """Every figure of one run, for tooling: the rows, the load average and the commit."""
    figures: list[dict[str, object]] = []
    for m in rows:
        figure: dict[str, object] = {"system": m.system, "operation": m.operation}
        if m.operation == "enqueue→start latency":
            ms = sorted(r * 1000 for r in m.runs)
            figure |= {"probes": len(ms), "p50_ms": statistics.median(ms), "max_ms": ms[-1]}
        elif m.operation.endswith(", CPU"):
            figure |= {"jobs": m.jobs, "cpu_us_per_job": round(m.seconds / m.jobs * 1e6, 1)}
            if m.startup is not None:
                after = round(cpu_after_start(m) * 1e6, 1)
                figure |= {"cpu_us_per_job_after_start": after}
        elif m.operation in USAGE_OPERATIONS:
            # Per job beyond the empty-queue run: µs of CPU, or context switches.
            per_job = (m.seconds - (m.startup or 0.0)) / m.jobs
            if m.operation.endswith(" CPU"):
                figure |= {"jobs": m.jobs, "us_per_job_after_start": round(per_job * 1e6, 1)}
            else:
                figure |= {"jobs": m.jobs, "per_job_after_start": round(per_job, 3)}
        elif m.operation == "idle worker CPU fraction":
            figure |= {"cpu_fraction": m.runs[0], "seconds": IDLE_CPU_SECONDS}
        else:
            figure |= {"jobs": m.jobs, "seconds": m.seconds, "jobs_per_s": m.rate}
            figure |= {"process_start_s": m.startup, "jobs_per_s_after_start": m.rate_after_start}
        figures.append(figure)
    return {
        "backend": backend,
        "synchronous": opts.synchronous,
        "idle_poll_s": opts.idle_poll,
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": {"before": load[0], "after": load[1]},
        "figures": figures,
    }


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


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
    parser.add_argument(
        "--idle-poll",
        type=float,
        default=30.0,
        help="the idle worker's --poll-interval in the pickup probe (30: only a wake-up is fast)",
    )
    parser.add_argument(
        "--idle-only", action="store_true", help="measure only the idle pickup and idle CPU"
    )
    parser.add_argument(
        "--enqueue-only",
        action="store_true",
        help="measure only enqueue (one by one and bulk) beside the peers, and its CPU",
    )
    parser.add_argument(
        "--source-start",
        action="store_true",
        help="leave replayq's bytecode uncompiled: each worker start compiles the source",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="replayq-bench-", dir=args.dir))
    opts = Options(args.jobs, args.repeat, args.synchronous, workdir, args.idle_poll)
    bytecode = "compiled at each start (--source-start)"
    if not args.source_start:
        bytecode = compile_package(Path(replayq.__file__).parent)
    try:
        before = load_average()
        if args.idle_only:
            probe = pg_replayq_latency if args.backend == "postgres" else sqlite_replayq_latency
            rows = idle_rows(probe(opts))
        elif args.enqueue_only:
            rows = run_enqueue_only(args.backend, opts)
        else:
            rows = BACKENDS[args.backend](opts)
        load = (before, load_average())
        if args.json:
            figures = as_json(args.backend, opts, rows, load)
            print(json.dumps({**figures, "bytecode": bytecode}, indent=2))
        elif args.enqueue_only:
            print(f"commit {git_commit()}; load average before {load[0]}; after {load[1]}")
            print("\n".join(enqueue_lines(rows)))
        elif args.idle_only:
            print(f"load average before {load[0]}; after {load[1]}")
            print("\n".join(idle_lines(rows, opts.idle_poll, "the wake-up", 20)))
        elif args.backend == "postgres":
            print(report_postgres(opts, rows, load))
            print(f"- replayq: {bytecode}")
        else:
            print(report(opts, args.backend, rows))
            print(f"- replayq: {bytecode}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
