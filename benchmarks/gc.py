"""Retention and gc: bytes per finished job in each tier, and the time gc takes.

    python benchmarks/gc.py [--jobs N] [--record N] [--derived N]
                            [--backend sqlite|postgres] [--json]

A fresh SQLite file (or PostgreSQL schema); ``--jobs`` jobs of a one-step handler
that reads and writes state, claims an effect, reads the clock and the random
source, recorded by a worker in this process on an injected clock; every 100th job's
step also returns a 4 KiB document (a blob). With ``--record N`` (a divisor of
``--jobs``) only N jobs are recorded and the database is then filled to ``--jobs`` by
copying their rows in SQL (``clone``: jobs, trace packs and their index entries, steps,
idempotency records and state versions, with fresh ids and keys): gc's cost is per row,
and recording 100,000 jobs on a loaded 2-core machine takes longer than the gc.
``--derived`` of the jobs are then dry-run, keeping their derived traces. Then, with
``Retention(full_days=1, ledger_days=3, derived_days=1)``:

* ``full``: the database as recorded (with the derived traces);
* ``ledger``: two days later, after ``App.gc`` trimmed every job to its lifecycle,
  effects and state writes and deleted the derived traces (the gc time of this pass is
  ``gc_ledger_seconds``, its CPU time ``gc_ledger_cpu_seconds``);
* ``deleted``: four days later, after gc deleted the jobs and then the blobs nothing
  references any more (state versions and the idempotency ledger remain: they belong to
  the entities and effects).

Bytes are the database's own measure after reclaiming free space: SQLite's
``page_count * page_size`` after ``VACUUM``; PostgreSQL's ``pg_total_relation_size``
over the schema's tables after ``VACUUM FULL``. Divided by ``--jobs``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine import PG_URL, PgSchemas, commit, load_average, machine

import replayq
from replayq.worker import Worker

DAY = 86_400.0
START = 1_700_000_000.0
# How long size_bytes waits for older snapshots of other sessions to end (PostgreSQL).
XMIN_WAIT = 300.0


def declare(app: replayq.App) -> None:
    @app.job("credit", retry=replayq.Retry(max_attempts=1))
    def credit(ctx: replayq.Context, account: str, amount: int) -> int:
        with ctx.step("credit"):
            balance = ctx.state.get("account", account)
            total = (balance.data or {}).get("balance", 0) + amount
            ctx.now()
            ctx.random()
            ctx.state.put("account", account, {"balance": total})
            ctx.effect("ledger.notify", lambda: total, key=f"notify:{ctx.job_id}")
        if ctx.job_id % 100 == 0:
            # Every 100th job: a step result above the inline limit, stored as a blob.
            ctx.step("render", lambda: {"doc": "".join(f"{ctx.job_id * k:x}" for k in range(600))})
        return int(total)


def record(app: replayq.App, jobs: int) -> float:
    started = time.perf_counter()
    for start in range(0, jobs, 500):
        app.enqueue_many(
            [
                replayq.EnqueueRequest("credit", {"account": f"acct-{n % 1000}", "amount": n % 7})
                for n in range(start, min(start + 500, jobs))
            ]
        )
    worker = Worker(app, worker_id="bench")
    app.register_contracts()
    try:
        while leased := worker.lease(50):
            for job in leased:
                worker.execute(job)
    finally:
        worker.event_loop.close()
    return time.perf_counter() - started


def _columns(tx: Any, table: str, postgres: bool) -> list[str]:
    if postgres:
        rows = tx.connection.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %(t)s "
            "ORDER BY ordinal_position",
            {"t": table},
        ).fetchall()
        return [r["column_name"] if isinstance(r, dict) else r[0] for r in rows]
    return [r[1] for r in tx.connection.execute(f"PRAGMA table_info({table})").fetchall()]


# Per table: the rows to copy, and the columns that change in a copy (``off``: added to job
# ids, ``poff``: to pack ids, ``suffix``: appended to keys).
_CLONED = {
    "rq_jobs": (
        "id <= {max_job}",
        {"id": "id + {off}", "trace_id": "trace_id || {suffix}", "message_id": "NULL"},
    ),
    "rq_trace": (
        "job_id IS NOT NULL AND job_id <= {max_job}",
        {"id": "id + {poff}", "job_id": "job_id + {off}", "trace_id": "trace_id || {suffix}"},
    ),
    "rq_trace_resources": (
        "pack_id IN (SELECT id FROM rq_trace WHERE job_id IS NOT NULL AND job_id <= {max_job})",
        # The resource as the copied pack's events name it: gc deletes a pack's index
        # entries by the names its events carry (a suffixed copy was never deleted).
        {"pack_id": "pack_id + {poff}"},
    ),
    "rq_steps": ("job_id <= {max_job}", {"job_id": "job_id + {off}"}),
    "rq_idempotency": (
        "job_id <= {max_job}",
        {"key": "key || {suffix}", "job_id": "job_id + {off}"},
    ),
    "rq_entity_versions": (
        "branch = 'main' AND job_id <= {max_job}",
        {"key": "key || {suffix}", "job_id": "job_id + {off}"},
    ),
    "rq_entities": ("branch = 'main' AND key NOT LIKE '%:c%'", {"key": "key || {suffix}"}),
}


def clone(app: replayq.App, recorded: int, copies: int, postgres: bool) -> float:
    """Copy the ``recorded`` jobs' rows ``copies - 1`` times (see the module's text).

    The rows to copy are first set aside once in ``bench_src_*`` tables (dropped at the
    end), so each copy reads ``recorded`` jobs' rows, not a growing table (selecting the
    resource index entries by pack id, or entities by key, scanned every earlier copy);
    50 copies a transaction keep SQLite's write-ahead log small.
    """
    started = time.perf_counter()

    def param(name: str) -> str:
        return f"%({name})s" if postgres else f":{name}"

    with app.storage.transaction() as tx:
        max_pack = tx.connection.execute("SELECT max(id) FROM rq_trace").fetchone()
        max_pack = max_pack[0] if not isinstance(max_pack, dict) else max_pack["max"]
        columns = {table: _columns(tx, table, postgres) for table in _CLONED}
        for table, (where, _changed) in _CLONED.items():
            sql = (
                f"CREATE TABLE bench_src_{table} AS SELECT * FROM {table} "
                f"WHERE {where.format(max_job=param('max_job'))}"
            )
            if postgres:
                sql = sql.replace("'%:c%'", "'%%:c%%'")
            tx.connection.execute(sql, {"max_job": recorded})
    for first in range(1, copies, 50):
        with app.storage.transaction() as tx:
            for copy in range(first, min(first + 50, copies)):
                values = {"off": copy * recorded, "poff": copy * max_pack, "suffix": f":c{copy}"}
                for table, (_where, changed) in _CLONED.items():
                    chosen = [
                        changed.get(c, c).format(**{k: param(k) for k in values})
                        for c in columns[table]
                    ]
                    tx.connection.execute(
                        f"INSERT INTO {table} ({', '.join(columns[table])}) "
                        f"SELECT {', '.join(chosen)} FROM bench_src_{table}",
                        values,
                    )
    with app.storage.transaction() as tx:
        for table in _CLONED:
            tx.connection.execute(f"DROP TABLE bench_src_{table}")
        if postgres:
            for table in ("rq_jobs", "rq_trace"):
                tx.connection.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"
                )
    return time.perf_counter() - started


def derive(app: replayq.App, count: int) -> float:
    """Dry-run the first ``count`` jobs, keeping their derived traces; the seconds it took."""
    started = time.perf_counter()
    ids = [j.id for j in app.list_jobs(job_type="credit", limit=count)]
    replayq.dry_run_many(app, ids)
    return time.perf_counter() - started


def size_bytes(app: replayq.App, url: str, schema: str | None) -> int:
    if schema is None:
        app.close()
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            db.execute("VACUUM")
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            page = db.execute("PRAGMA page_size").fetchone()[0]
        return int(pages * page)
    import psycopg

    base = url.split("?")[0]
    with psycopg.connect(base, autocommit=True) as db:
        # VACUUM FULL keeps the rows gc deleted while any session of the database still has
        # a snapshot older than the deletion (a test or benchmark of other work, in a long
        # transaction): wait for those to end, else the bytes include dead rows.
        now = db.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
        waited = time.monotonic()
        while time.monotonic() - waited < XMIN_WAIT:
            older = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL "
                "AND backend_xmin::text::bigint < %s",
                (now,),
            ).fetchone()[0]
            if not older:
                break
            time.sleep(0.2)
        else:
            print(
                f"warning: sessions older than gc's deletions after {XMIN_WAIT:.0f} s; "
                "the bytes may include dead rows",
                file=sys.stderr,
            )
        tables = [
            r[0]
            for r in db.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (schema,),
            )
        ]
        total = 0
        for table in tables:
            db.execute(f'VACUUM FULL "{schema}"."{table}"')
            total += db.execute(
                "SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}"."{table}"',)
            ).fetchone()[0]
    return int(total)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--derived", type=int, default=1_000, help="jobs dry-run (kept)")
    parser.add_argument(
        "--record", type=int, default=None, help="jobs recorded; the rest copied in SQL"
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (--backend postgres)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="replayq-gc-bench-"))
    schemas = PgSchemas(args.pg_url) if args.backend == "postgres" else None
    url = f"sqlite:///{workdir / 'gc.db'}" if schemas is None else schemas.fresh("gc")
    if schemas is not None:
        # On a loaded machine this process may wait seconds for a CPU inside a transaction;
        # the pool's 10 s idle-in-transaction timeout ended its session mid-clone.
        url += "&idle_in_transaction_timeout=600"
    schema = None if schemas is None else schemas.made[-1]
    clock = replayq.FrozenClock(START)
    retention = replayq.Retention(full_days=1, ledger_days=3, derived_days=1)

    def open_app() -> replayq.App:
        app = replayq.App(url, clock=clock, auto_migrate=True, retention=retention)
        declare(app)
        return app

    try:
        app = open_app()
        recorded = args.record or args.jobs
        if args.jobs % recorded:
            parser.error("--jobs must be a multiple of --record")
        record_seconds = record(app, recorded)
        clone_seconds = clone(app, recorded, args.jobs // recorded, schemas is not None)
        derive_seconds = derive(app, args.derived)
        full = size_bytes(app, url, schema)
        clock.advance(2 * DAY)
        app = open_app()
        cpu = time.process_time()
        ledger_report = app.gc(batch=500)
        ledger_cpu = time.process_time() - cpu
        ledger = size_bytes(app, url, schema)
        clock.advance(2 * DAY)
        app = open_app()
        cpu = time.process_time()
        deleted_report = app.gc(batch=500)
        deleted_cpu = time.process_time() - cpu
        deleted = size_bytes(app, url, schema)
    finally:
        if schemas is not None:
            schemas.drop_all()
    result: dict[str, Any] = {
        "backend": args.backend,
        "jobs": args.jobs,
        "recorded": recorded,
        "record_seconds": round(record_seconds, 2),
        "cloned": args.jobs - recorded,
        "clone_seconds": round(clone_seconds, 2),
        "derived": args.derived,
        "derive_seconds": round(derive_seconds, 2),
        "bytes_per_job": {
            "full": round(full / args.jobs),
            "ledger": round(ledger / args.jobs),
            "deleted": round(deleted / args.jobs),
        },
        "gc_ledger_seconds": round(ledger_report.seconds, 2),
        "gc_ledger_cpu_seconds": round(ledger_cpu, 2),
        "gc_ledger_events_removed": ledger_report.events_removed,
        "gc_derived_traces": ledger_report.derived_traces,
        "gc_delete_seconds": round(deleted_report.seconds, 2),
        "gc_delete_cpu_seconds": round(deleted_cpu, 2),
        "gc_deleted_jobs": deleted_report.purged_jobs,
        "gc_blobs": deleted_report.blobs,
        "gc_blob_bytes": deleted_report.blob_bytes,
        "load_average": load_average(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        json.dump(result, sys.stdout)
        print()
        return
    for key, value in result.items():
        print(f"{key:<28} {value}")
    for key, value in machine(workdir):
        print(f"{key:<28} {value}")


if __name__ == "__main__":
    main()
