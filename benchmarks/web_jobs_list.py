"""How long the dashboard's job list takes to load with 100,000 jobs on SQLite.

Builds a fresh SQLite database: ``--seed`` jobs (default 1,000) go through
``App.enqueue_many`` (the real insert path), then one ``INSERT ... SELECT`` copies
them up to ``--jobs`` rows (default 100,000) with their own trace ids, spread over
four types, two handler versions, every state and a month of ``created_at``; the
list reads only the jobs table, so the copies carry no events. Then it starts a real
``replayq web`` process on that file and times the HTTP GET of each job-list page
(the request, the query and the rendering, as a browser would wait for them):
the unfiltered page, each filter, a filter that matches few rows, and a page deep in
the list. The budget is 300 ms per page; the exit status is 1 if a median is over it.

    python benchmarks/web_jobs_list.py [--jobs 100000] [--requests 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import commit, load_average, machine

import replayq

BUDGET_MS = 300.0
TYPES = ("ship_order", "send_email", "charge_card", "sync_stock")
REPLAYQ = str(Path(sys.executable).with_name("replayq"))


def build(path: Path, jobs: int, seed: int) -> float:
    """The database at ``path`` with ``jobs`` rows; returns the seconds it took."""
    started = time.perf_counter()
    app = replayq.App(f"sqlite:///{path}", auto_migrate=True)
    for job_type in TYPES:
        app.job(job_type, version="v1")(lambda ctx, **payload: None)
    app.enqueue_many(
        [
            replayq.EnqueueRequest(TYPES[n % len(TYPES)], {"order_id": n, "note": "x" * 40})
            for n in range(seed)
        ]
    )
    app.close()
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(rq_jobs)") if row[1] != "id"]
        by_type = " ".join(f"WHEN {i} THEN '{t}'" for i, t in enumerate(TYPES))
        copied = {
            "trace_id": "lower(hex(randomblob(16)))",
            "message_id": "NULL",
            "job_type": f"CASE (s.n % {len(TYPES)}) {by_type} END",
            "handler_version": "CASE WHEN s.n % 10 = 0 THEN 'v2' ELSE 'v1' END",
            # Mostly settled history, a backlog, a few running and dead: a busy day's table.
            "state": "CASE WHEN s.n % 100 = 0 THEN 'dead' WHEN s.n % 50 = 1 THEN 'running' "
            "WHEN s.n % 5 = 2 THEN 'queued' WHEN s.n % 97 = 3 THEN 'cancelled' "
            "ELSE 'succeeded' END",
            "created_at": f"j.created_at - 2592000.0 + s.n * (2592000.0 / {jobs})",
            "last_error": "CASE WHEN s.n % 100 = 0 THEN 'upstream said no' ELSE NULL END",
            "dead_reason": "CASE WHEN s.n % 100 = 0 THEN 'max_attempts' ELSE NULL END",
        }
        select = ", ".join(copied.get(c, f"j.{c}") for c in columns)
        conn.execute(
            f"""
            WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < ?)
            INSERT INTO rq_jobs ({", ".join(columns)})
            SELECT {select} FROM s JOIN rq_jobs j ON j.id = 1 + (s.n % ?)
            """,
            (jobs - seed, seed),
        )
        conn.execute("ANALYZE")
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 -- http://127.0.0.1 only
        body = response.read()
    return (time.perf_counter() - started) * 1000, body


def start_web(db: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_WEB_TOKEN"}
    proc = subprocess.Popen(
        [REPLAYQ, "--db", f"sqlite:///{db}", "web", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            get(url + "/jobs?limit=1")
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("replayq web did not start") from None
            time.sleep(0.1)


def pages(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM rq_jobs").fetchone()
        (middle,) = conn.execute(
            "SELECT id FROM rq_jobs ORDER BY id LIMIT 1 OFFSET ?", (count // 2,)
        ).fetchone()
    return {
        "all": "/jobs",
        "state=dead": "/jobs?state=dead",
        "state=queued&type=send_email": "/jobs?state=queued&type=send_email",
        "version=v2": "/jobs?version=v2",
        "version=v2&state=dead": "/jobs?version=v2&state=dead",
        "state=cancelled&type=sync_stock&version=v2": (
            "/jobs?state=cancelled&type=sync_stock&version=v2"
        ),
        "deep page (before the middle id)": f"/jobs?before={middle}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1_000, help="jobs enqueued through the API")
    parser.add_argument("--requests", type=int, default=20, help="timed GETs per page")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="replayq-bench-web-"))
    db = workdir / "jobs.db"
    build_seconds = build(db, args.jobs, args.seed)
    proc, url = start_web(db)
    results: list[dict[str, Any]] = []
    try:
        for name, path in pages(db).items():
            get(url + path)  # warm: the first request of a page compiles its template
            times = sorted(get(url + path)[0] for _ in range(args.requests))
            _, body = get(url + path)
            results.append(
                {
                    "page": name,
                    "path": path,
                    "rows": body.count(b'<td><a href="/jobs/'),
                    "median_ms": round(statistics.median(times), 1),
                    "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
                    "max_ms": round(times[-1], 1),
                }
            )
    finally:
        proc.terminate()
        proc.wait(10)
    over = [r["page"] for r in results if r["median_ms"] > BUDGET_MS]
    report = {
        "benchmark": "web_jobs_list",
        "jobs": args.jobs,
        "build_seconds": round(build_seconds, 1),
        "requests_per_page": args.requests,
        "budget_ms": BUDGET_MS,
        "over_budget": over,
        "pages": results,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": load_average(),
        "machine": dict(machine(workdir)),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.jobs} jobs built in {build_seconds:.1f}s; {args.requests} GETs per page")
        print(f"{'page':<45} {'rows':>5} {'median':>9} {'p95':>9} {'max':>9}")
        for r in results:
            print(
                f"{r['page']:<45} {r['rows']:>5} {r['median_ms']:>7.1f}ms "
                f"{r['p95_ms']:>7.1f}ms {r['max_ms']:>7.1f}ms"
            )
        for key, value in machine(workdir):
            print(f"{key}: {value}")
        print(f"commit: {report['commit']}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
