"""How fast a recorded job dry-runs: one 10-step job many times, and 1,000 recorded jobs in bulk.

A fresh SQLite file (or PostgreSQL schema); ``--jobs`` jobs of a 10-step handler
(two ``ctx.call``, two ``ctx.effect``, three ``ctx.state.get``, three
``ctx.state.put``, a ``ctx.now`` and three ``ctx.decide``) are recorded by an
in-process ``Worker(app, burst=True)``. Then, with the Python API
(``replayq.replay.engine.dry_run``, what ``replayq replay JOB --mode dry-run`` calls
after its process start):

* **single**: the first recorded job dry-run ``--runs`` times; the median, the
  10th and 90th percentiles and the spread of the wall time of one dry-run;
* **bulk**: every recorded job dry-run once with ``dry_run_many`` (with ``--no-keep``
  through its quick check, ``replayq.replay.quick``: how many jobs it vouched for is
  ``bulk_matched_in_memory``), for each
  process count of ``--processes`` (``1,2``: one pass in this process, one with two
  worker processes that import ``replay_speed:APP``); jobs/s for each. With worker
  processes the same call is made twice: the first starts them (each a fresh
  interpreter importing replayq and the application), the second finds them up, as
  every later call of a long-running verifier does; both are reported.

Each dry-run reads the recording (events, blobs), runs the handler with every call,
effect, clock read and state read answered from the recording, compares it with the
recording as it runs and, unless ``--no-keep``, writes its derived trace, branch state
and lineage at the end (``keep=False``: verification only, nothing written). The
script checks that no dry-run diverged and that the handler's outside functions were
never called in this process during them (in worker processes a missing answer would
be a divergence, which is checked too).

    python benchmarks/replay_speed.py [--jobs 1000] [--runs 50] [--processes 1,2]
                                      [--backend sqlite|postgres] [--json] [--no-keep]

``--json`` prints one object (dry-run median, p10/p90, bulk jobs/s per process
count, load average, commit) and CPU figures beside the wall times: the median CPU
time of one dry-run and the CPU time per job of each bulk pass (this process plus
its finished worker processes), which a busy machine inflates less.
``--backend postgres`` records into a fresh schema on ``--pg-url``. The script runs
on an earlier tree too (``PYTHONPATH=<tree>/src``): where ``dry_run_many`` takes no
``app``, it is called without one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine import PG_URL, PgSchemas, commit, load_average, machine

import replayq
import replayq.replay.bulk
from replayq.replay.engine import dry_run, dry_run_many

# Worker processes that stay up between calls (absent in a tree whose workers end with each).
close_workers = getattr(replayq.replay.bulk, "close_workers", None)

CUSTOMERS = 50
QUICK: dict[int, int] = {}  # per process count: reports of the quick check (``replay.quick``)
REAL_CALLS = {"quote": 0, "stock": 0, "charge": 0, "email": 0}


def quote(order_id: int) -> dict[str, Any]:
    REAL_CALLS["quote"] += 1
    lines = [{"sku": f"SKU-{(order_id + n) % 997:04d}", "qty": 1 + n % 3} for n in range(6)]
    return {"lines": lines, "total_cents": 1_000 + order_id % 9_000}


def stock(order_id: int) -> dict[str, Any]:
    REAL_CALLS["stock"] += 1
    return {"available": order_id % 17 != 0, "warehouse": f"wh-{order_id % 4}"}


def charge(order_id: int, amount: int) -> dict[str, Any]:
    REAL_CALLS["charge"] += 1
    return {"charge_id": f"ch_{order_id:08d}", "amount_cents": amount}


def email(order_id: int) -> dict[str, Any]:
    REAL_CALLS["email"] += 1
    return {"message_id": f"msg-{order_id}"}


def make_app(url: str) -> replayq.App:
    app = replayq.App(url)

    @app.job("order.fulfil", lease="60s", heartbeat="20s")
    def fulfil(ctx: replayq.Context, order_id: int, customer: int) -> dict[str, Any]:
        with ctx.step("validate"):
            ctx.decide("valid", order_id > 0, rule="positive id")
        with ctx.step("load"):
            order = ctx.state.get("order", order_id)
        with ctx.step("price"):
            priced = ctx.call("pricing.quote", quote, order_id)
        with ctx.step("stock"):
            available = ctx.call("inventory.stock", stock, order_id)
            route = ctx.decide("route", "ship" if available["available"] else "backorder")
        with ctx.step("reserve"):
            ctx.state.put(
                "order",
                order_id,
                {**(order.data or {}), "status": "reserved", "total": priced["total_cents"]},
            )
        with ctx.step("stamp"):
            stamped = ctx.now()
        with ctx.step("charge"):
            receipt = ctx.effect(
                "payment.charge",
                lambda: charge(order_id, priced["total_cents"]),
                key=f"charge:{order_id}",
            )
        with ctx.step("account"):
            account = ctx.state.get("account", customer)
            before = account.data or {"spent_cents": 0, "orders": 0}
            ctx.state.put(
                "account",
                customer,
                {
                    "spent_cents": before["spent_cents"] + priced["total_cents"],
                    "orders": before["orders"] + 1,
                },
            )
        with ctx.step("notify"):
            ctx.effect("email.send", lambda: email(order_id), key=f"email:{order_id}")
        with ctx.step("finish"):
            current = ctx.state.get("order", order_id)
            ctx.decide("done", route, charged=receipt["charge_id"])
            ctx.state.put(
                "order", order_id, {**current.data, "status": route, "stamped_at": stamped}
            )
        return {"charge_id": receipt["charge_id"], "route": route}

    return app


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def record(app: replayq.App, jobs: int) -> tuple[list[int], float]:
    requests = [
        replayq.EnqueueRequest("order.fulfil", {"order_id": n, "customer": n % CUSTOMERS})
        for n in range(1, jobs + 1)
    ]
    ids = app.enqueue_many(requests)
    started = time.perf_counter()
    stats = replayq.Worker(app, burst=True, worker_id="bench-record").run()
    elapsed = time.perf_counter() - started
    if stats.succeeded != jobs:
        raise SystemExit(f"recording: {stats.succeeded} of {jobs} jobs succeeded: {stats}")
    return ids, elapsed


def checked_dry_run(app: replayq.App, job_id: int, *, keep: bool = True) -> None:
    report = dry_run(app, job_id) if keep else dry_run(app, job_id, keep=False)
    if report.diverged:
        raise SystemExit(f"job {job_id}: the dry-run diverged: {report.to_dict()}")


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the bulk worker processes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def live_worker_cpu() -> float:
    """CPU time so far of the bulk dry-run's worker processes that are still up (Linux:
    ``/proc/PID/stat``); 0 where there are none or no ``/proc``."""
    pool = getattr(replayq.replay.bulk, "_POOL", None)
    total = 0.0
    for worker in getattr(pool, "workers", []):
        try:
            fields = Path(f"/proc/{worker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def bulk_dry_run(
    app: replayq.App, ids: list[int], *, keep: bool, processes: int
) -> tuple[float, float, float | None, float | None]:
    """Dry-run every job once with ``dry_run_many``: the wall and CPU seconds it took; with
    worker processes, also the wall and CPU seconds of the same call again while they are
    up (the first call starts them: a fresh interpreter importing replayq and the app).

    On a tree whose ``dry_run_many`` takes no ``app`` (before worker processes), it is
    called without it."""
    options: dict[str, Any] = {"keep": keep, "processes": processes}
    if "app" in inspect.signature(dry_run_many).parameters:
        options["app"] = "replay_speed:APP"

    def timed() -> tuple[float, float]:
        started, cpu = time.perf_counter(), cpu_seconds() + live_worker_cpu()
        reports = dry_run_many(app, ids, **options)
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds() + live_worker_cpu() - cpu
        if len(reports) != len(ids):
            raise SystemExit(f"{len(reports)} reports for {len(ids)} jobs")
        for report in reports:
            if report.diverged:
                raise SystemExit(f"job {report.job_id}: the dry-run diverged: {report.to_dict()}")
        # Jobs the quick check of a ``keep=False`` run vouched for (absent before round 7);
        # counted in this process only: a worker process's report travels without the flag.
        if processes == 1:
            QUICK[processes] = sum(bool(getattr(r, "matched_in_memory", False)) for r in reports)
        return elapsed, cpu

    elapsed, cpu = timed()
    if processes == 1 or close_workers is None:
        return elapsed, cpu, None, None
    warm, warm_cpu = timed()
    close_workers()  # worker processes stay up between calls: end them before the next pass
    return elapsed, cpu, warm, warm_cpu


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="recorded jobs (bulk dry-run)")
    parser.add_argument("--runs", type=int, default=50, help="dry-runs of the single job")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (--backend postgres)")
    parser.add_argument("--no-keep", action="store_true", help="dry-runs write nothing")
    parser.add_argument(
        "--processes", default="1", help="bulk dry-run process counts, comma-separated: 1,2"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the database goes")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="replayq-replay-bench-", dir=args.dir))
    path = workdir / "replay.db"
    schemas = PgSchemas(args.pg_url) if args.backend == "postgres" else None
    url = f"sqlite:///{path}" if schemas is None else schemas.fresh("replay")
    if schemas is not None:
        replayq.App(url).schema_upgrade()
    app = make_app(url)
    keep = not args.no_keep
    counts = [int(n) for n in str(args.processes).split(",")]
    try:
        ids, recording_seconds = record(app, args.jobs)
        real_after_recording = dict(REAL_CALLS)
        events = len([e for e in app.trace(ids[0]) if e.kind == "domain"])
        print(f"  recorded {args.jobs} jobs in {recording_seconds:.2f}s", file=sys.stderr)

        checked_dry_run(app, ids[-1], keep=keep)  # warm-up: imports, statement caches
        single, single_cpu = [], []
        for _ in range(args.runs):
            started, cpu = time.perf_counter(), time.process_time()
            checked_dry_run(app, ids[0], keep=keep)
            single.append(time.perf_counter() - started)
            single_cpu.append(time.process_time() - cpu)
        print(f"  single: median {statistics.median(single) * 1e3:.1f} ms", file=sys.stderr)

        bulk: dict[int, float] = {}
        bulk_cpu: dict[int, float] = {}
        warm: dict[int, float] = {}
        warm_cpu: dict[int, float] = {}
        for processes in counts:
            bulk[processes], bulk_cpu[processes], again, again_cpu = bulk_dry_run(
                app, ids, keep=keep, processes=processes
            )
            print(f"  bulk, {processes} process(es): {bulk[processes]:.2f}s", file=sys.stderr)
            if again is not None and again_cpu is not None:
                warm[processes], warm_cpu[processes] = again, again_cpu
                print(f"  again, workers up: {again:.2f}s", file=sys.stderr)
        if real_after_recording != REAL_CALLS:
            raise SystemExit(f"a dry-run reached the outside functions: {REAL_CALLS}")
        app.close()
        size = 0
        if schemas is None:
            conn = sqlite3.connect(path)
            size = conn.execute(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            ).fetchone()[0]
            conn.close()

        ms = [s * 1e3 for s in single]
        if args.json:
            figures = {
                "benchmark": "replay_speed",
                "backend": args.backend,
                "commit": commit(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "load_average": load_average(),
                "jobs": args.jobs,
                "keep": keep,
                "dry_run_ms_median": round(statistics.median(ms), 3),
                "dry_run_ms_p10": round(percentile(ms, 0.1), 3),
                "dry_run_ms_p90": round(percentile(ms, 0.9), 3),
                "dry_run_cpu_ms_median": round(statistics.median(single_cpu) * 1e3, 3),
                "bulk_jobs_per_s": {str(n): round(len(ids) / t, 1) for n, t in bulk.items()},
                # CPU seconds of this process and the worker processes, per job: what the
                # machine's other load does not inflate as much as wall time.
                "bulk_cpu_ms_per_job": {
                    str(n): round(t / len(ids) * 1e3, 3) for n, t in bulk_cpu.items()
                },
                # The same call again while the worker processes are up (no start-up).
                "bulk_jobs_per_s_workers_up": {
                    str(n): round(len(ids) / t, 1) for n, t in warm.items()
                },
                "bulk_cpu_ms_per_job_workers_up": {
                    str(n): round(t / len(ids) * 1e3, 3) for n, t in warm_cpu.items()
                },
                # How many of the bulk pass's jobs the quick check found the same as recorded
                # (no events built); the rest ran the full dry-run.
                "bulk_matched_in_memory": {str(n): c for n, c in QUICK.items()},
                "bulk_how": "dry_run_many, worker processes importing replay_speed:APP"
                if "app" in inspect.signature(dry_run_many).parameters
                else "dry_run_many (no worker processes in this tree)",
                "recording_jobs_per_s": round(args.jobs / recording_seconds, 1),
                "domain_events_per_job": events,
            }
            print(json.dumps(figures, indent=1))
            return
        backend = "SQLite" if schemas is None else "PostgreSQL"
        lines = [f"## Dry-run speed — {backend}", ""]
        lines += [f"- {key}: {value}" for key, value in machine(workdir)]
        lines += [
            f"- commit: {commit()}",
            f"- recorded job: 10 steps, {events} domain events; {args.jobs} jobs recorded by one "
            f"in-process worker in {recording_seconds:.2f}s ({args.jobs / recording_seconds:,.0f}"
            " jobs/s)",
            f"- database after all dry-runs: {size / 1e6:.1f} MB (dry-runs add their own traces)"
            if size
            else "- database: PostgreSQL",
            "",
            "| measurement | runs | median | p10 | p90 | spread |",
            "|---|---:|---:|---:|---:|---|",
            f"| one 10-step job, ms per dry-run | {args.runs} | {statistics.median(ms):.2f} "
            f"| {percentile(ms, 0.1):.2f} | {percentile(ms, 0.9):.2f} "
            f"| {min(ms):.2f} to {max(ms):.2f} |",
            "",
            "| bulk dry-run (`dry_run_many`) | jobs | seconds | jobs/s | ms/job |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| every recorded job once, {n} process(es), keep={keep} | {len(ids)} "
                f"| {t:.2f} | {len(ids) / t:,.0f} | {t / len(ids) * 1e3:.2f} |"
                for n, t in bulk.items()
            ),
            *(
                f"| the same again, worker processes up, {n} process(es), keep={keep} "
                f"| {len(ids)} | {t:.2f} | {len(ids) / t:,.0f} | {t / len(ids) * 1e3:.2f} |"
                for n, t in warm.items()
            ),
            "",
            "No dry-run diverged; the outside functions were called 0 times during the dry-runs.",
        ]
        print("\n".join(lines))
    finally:
        app.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            if schemas is not None:
                schemas.drop_all()


# What the bulk dry-run's worker processes import (``--app``-style): the same handlers; each
# worker points them at the benchmark's database.
APP = make_app("sqlite:///:memory:")

if __name__ == "__main__":
    main()
