"""What replayq's recording costs per job: a 5-step handler traced vs the same database work.

Both sides run the same jobs through the same queue: a fresh SQLite file,
``App.enqueue_many``, then an in-process ``Worker(app, burst=True).run()`` (one
executor), timed from ``run()`` until it returns with every job ``succeeded``.
The lease, the ack and their two lifecycle events cost the same on both sides.
Only the handler differs:

* ``traced``: the handler goes through ``ctx``. Steps ``load`` (two
  ``ctx.state.get``), ``price`` (one ``ctx.call`` whose response, ~2.6 KB, goes
  to the blob store), ``reserve`` (``ctx.state.put`` of a new order),
  ``charge`` (one ``ctx.effect`` behind an idempotency record) and ``confirm``
  (``ctx.state.put`` of the customer's account, an update). Each step commits
  its events and state writes in one transaction; the effect claims and
  completes its record in two more.
* ``plain``: the same database work with no recording, as an application would
  write it by hand with ``sqlite3`` on its own connection to the same file
  (replayq's pragmas): ``load`` reads both rows in one read transaction,
  ``price`` calls the function, ``reserve`` and ``confirm`` are each one
  versioned upsert (compare-and-set on ``version``) in a write transaction, and
  ``charge`` inserts an idempotency record (``started``, claim token) in one
  transaction, runs the effect, and marks it ``succeeded`` with its result in
  another. Steps that write nothing commit nothing.
* ``queue only``: a handler that returns at once (the queue's own cost).

So the difference is the recording: trace events, blobs, HLC stamps, step
bookkeeping and its commits, entity version rows with deltas.

    python benchmarks/context_overhead.py [--jobs 2000] [--repeat 3] [--lines 32]
                                          [--backend sqlite|postgres] [--json]
                                          [--rtt-ms MS] [--dir DIR] [--profile]
                                          [--names default|other]

``--names other`` runs the same jobs with the handler's names changed (job type,
steps, namespaces, call, effect kind and key; each the same length as the default's
and none in packs.DICTIONARY_2, which holds the default's): the trace's bytes for a
handler whose names the dictionary does not know. ``--names default`` is the above.

``--json`` prints one object instead of the tables: each side's µs/job, the
overhead %, transactions, event rows, rows and bytes per job, the load average
and the commit, so that runs on different commits can be compared.
``--backend postgres`` runs every drain in a fresh schema on ``--pg-url``
(default ``$REPLAYQ_TEST_PG``); the plain side then uses ``psycopg``. ``--rtt-ms``
puts ``latency_proxy.py`` between both sides and the server, adding that much to every
round trip, as a server on another host would: a side's round trips then show in its time.

``--profile`` also runs the traced and plain handlers inline (lease + execute
on the main thread, as ``replayq.testing.run_inline`` does), once with every
``sqlite3`` connection timing its statements (time inside SQLite by statement,
and the rest: Python) and once under cProfile, and prints where the traced
side's extra time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from machine import PG_URL, PgSchemas, commit, delayed_url, load_average, machine, schema_of

import replayq
from replayq.storage import packs

AIM = 0.15
CUSTOMERS = 50
BUSY_TIMEOUT_MS = 5000  # replayq's default (storage/sqlite/__init__.py)
SIDES = ("plain", "traced", "queue only")


# -- the outside world both handlers use ----------------------------------------------------


def quote(order_id: int, lines: int) -> dict[str, Any]:
    """A pricing service's answer: ``lines`` priced lines (~125 bytes of JSON each)."""
    items = [
        {
            "sku": f"SKU-{(order_id * 7 + n) % 10_000:05d}",
            "qty": 1 + (order_id + n) % 3,
            "unit_cents": 199 + (order_id * 13 + n * 31) % 5_000,
            "tax_rate": 0.2,
            "warehouse": f"wh-{n % 4}",
        }
        for n in range(lines)
    ]
    total = sum(item["qty"] * item["unit_cents"] for item in items)
    return {"order_id": order_id, "currency": "EUR", "lines": items, "total_cents": total}


def charge(order_id: int, amount_cents: int) -> dict[str, Any]:
    """A payment provider's answer."""
    return {"charge_id": f"ch_{order_id:08d}", "amount_cents": amount_cents, "status": "paid"}


# -- the handler's names ---------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """The names a handler gives its job type, steps, entities, call and effect."""

    job: str
    steps: tuple[str, str, str, str, str]  # load, price, reserve, charge, confirm
    order: str  # the namespace of the job's own entity
    account: str  # the namespace of the customer's entity
    call: str
    effect: str  # the effect's kind
    key: str  # the effect's idempotency key's prefix


DEFAULT_NAMES = Names(
    "order.process",
    ("load", "price", "reserve", "charge", "confirm"),
    "order",
    "account",
    "pricing.quote",
    "payment.charge",
    "charge",
)
# The same lengths as the default's, none of them in packs.DICTIONARY_2.
OTHER_NAMES = Names(
    "ledger.settle",
    ("pull", "quote", "earmark", "settle", "journal"),
    "entry",
    "partner",
    "tariff.lookup",
    "ledger.debited",
    "outlay",
)
NAMES = {"default": DEFAULT_NAMES, "other": OTHER_NAMES}


# -- the three apps -------------------------------------------------------------------------


def make_traced_app(url: str, lines: int, names: Names = DEFAULT_NAMES) -> replayq.App:
    app = replayq.App(url)
    load, price, reserve, charge_, confirm = names.steps

    @app.job(names.job, lease="60s", heartbeat="20s")
    def process(ctx: replayq.Context, order_id: int, customer: int) -> dict[str, Any]:
        with ctx.step(load):
            order = ctx.state.get(names.order, order_id)
            account = ctx.state.get(names.account, customer)
        with ctx.step(price):
            priced = ctx.call(names.call, quote, order_id, lines)
        total = priced["total_cents"]
        with ctx.step(reserve):
            ctx.state.put(
                names.order,
                order_id,
                {**(order.data or {}), "customer": customer, "status": "reserved", "total": total},
            )
        with ctx.step(charge_):
            receipt = ctx.effect(
                names.effect, lambda: charge(order_id, total), key=f"{names.key}:{order_id}"
            )
        with ctx.step(confirm):
            before = account.data or {"balance_cents": 0, "orders": 0}
            ctx.state.put(
                names.account,
                customer,
                {
                    "balance_cents": before["balance_cents"] - total,
                    "orders": before["orders"] + 1,
                    "last_order": order_id,
                },
            )
        return {"charge_id": receipt["charge_id"]}

    return app


PLAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS app_entities (
    namespace TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    version   INTEGER NOT NULL,
    data      TEXT    NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE TABLE IF NOT EXISTS app_idempotency (
    key          TEXT    PRIMARY KEY,
    operation    TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    claim_token  TEXT    NOT NULL,
    started_at   REAL    NOT NULL,
    completed_at REAL,
    result       TEXT,
    job_id       INTEGER,
    attempt      INTEGER
);
"""

# A versioned upsert: insert version 1, or bump the version if it is still the one read.
UPSERT = """
INSERT INTO app_entities (namespace, key, version, data) VALUES (:ns, :key, 1, :data)
ON CONFLICT (namespace, key) DO UPDATE SET version = app_entities.version + 1, data = excluded.data
WHERE app_entities.version = :expected
"""
CLAIM = """
INSERT INTO app_idempotency (key, operation, status, claim_token, started_at, job_id, attempt)
VALUES (:key, :operation, 'started', :claim, :now, :job_id, :attempt)
ON CONFLICT (key) DO NOTHING RETURNING key
"""
SUCCEED = """
UPDATE app_idempotency SET status = 'succeeded', result = :result, completed_at = :now
WHERE key = :key AND claim_token = :claim AND status = 'started'
"""
READ = "SELECT version, data FROM app_entities WHERE namespace = ? AND key = ?"


def _pg_style(sql: str) -> str:
    """sqlite3's ``:name`` and ``?`` placeholders as psycopg's."""
    return re.sub(r"(?<!:):([a-z_]+)", r"%(\1)s", sql).replace("?", "%s")


class PlainDatabase:
    """The application's own connections (one per thread), set up as replayq sets up its own."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self._local = threading.local()
        self._all: list[Any] = []
        if place.backend == "sqlite":
            self.conn().executescript(PLAIN_SCHEMA)
        else:
            for statement in PLAIN_SCHEMA.split(";"):
                if statement.strip():
                    self.conn().execute(statement)

    def conn(self) -> Any:
        conn: Any = getattr(self._local, "conn", None)
        if conn is None:
            if self.place.backend == "sqlite":
                conn = sqlite3.connect(
                    self.place.path, isolation_level=None, check_same_thread=False
                )
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            else:
                import psycopg

                conn = psycopg.connect(self.place.conninfo, autocommit=True)
            self._local.conn = conn
            self._all.append(conn)
        return conn

    def sql(self, statement: str) -> str:
        return statement if self.place.backend == "sqlite" else _pg_style(statement)

    @contextmanager
    def transaction(self, *, readonly: bool = False) -> Any:
        count_transaction()
        conn = self.conn()
        if self.place.backend == "postgres":
            with conn.transaction():
                yield conn
            return
        conn.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        for conn in self._all:
            conn.close()


def _read(db: PlainDatabase, conn: Any, namespace: str, key: int) -> tuple[int, Any]:
    row = conn.execute(db.sql(READ), (namespace, str(key))).fetchone()
    return (0, None) if row is None else (int(row[0]), json.loads(row[1]))


def _upsert(
    db: PlainDatabase, conn: Any, namespace: str, key: int, data: Any, expected: int
) -> None:
    params = {"ns": namespace, "key": str(key), "data": json.dumps(data), "expected": expected}
    if conn.execute(db.sql(UPSERT), params).rowcount != 1:
        raise replayq.ConcurrencyError(f"{namespace}:{key}: not at version {expected}")


def make_plain_app(
    url: str, db: PlainDatabase, lines: int, names: Names = DEFAULT_NAMES
) -> replayq.App:
    app = replayq.App(url)

    @app.job(names.job, lease="60s", heartbeat="20s")
    def process(ctx: replayq.Context, order_id: int, customer: int) -> dict[str, Any]:
        with db.transaction(readonly=True) as conn:  # load
            order_version, order = _read(db, conn, names.order, order_id)
            account_version, account = _read(db, conn, names.account, customer)
        priced = quote(order_id, lines)  # price
        total = priced["total_cents"]
        with db.transaction() as conn:  # reserve
            data = {**(order or {}), "customer": customer, "status": "reserved", "total": total}
            _upsert(db, conn, names.order, order_id, data, order_version)
        key, claim = f"{names.key}:{order_id}", uuid.uuid4().hex  # charge
        with db.transaction() as conn:
            params = {"key": key, "operation": names.effect, "claim": claim}
            params.update(now=time.time(), job_id=ctx.job_id, attempt=ctx.attempt)
            if conn.execute(db.sql(CLAIM), params).fetchone() is None:
                raise RuntimeError(f"{key} already claimed (the benchmark never repeats a key)")
        receipt = charge(order_id, total)
        with db.transaction() as conn:
            params = {"key": key, "claim": claim, "result": json.dumps(receipt), "now": time.time()}
            conn.execute(db.sql(SUCCEED), params)
        before = account or {"balance_cents": 0, "orders": 0}  # confirm
        with db.transaction() as conn:
            data = {
                "balance_cents": before["balance_cents"] - total,
                "orders": before["orders"] + 1,
                "last_order": order_id,
            }
            _upsert(db, conn, names.account, customer, data, account_version)
        return {"charge_id": receipt["charge_id"]}

    return app


def make_queue_only_app(url: str, names: Names = DEFAULT_NAMES) -> replayq.App:
    app = replayq.App(url)

    @app.job(names.job, lease="60s", heartbeat="20s")
    def process(ctx: replayq.Context, order_id: int, customer: int) -> None:
        return None

    return app


# -- running --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    jobs: int
    repeat: int
    lines: int
    workdir: Path
    backend: str = "sqlite"
    schemas: PgSchemas | None = None
    # Added to each PostgreSQL round trip by latency_proxy.py (``--rtt-ms``): 0, none.
    rtt_ms: float = 0.0
    names: Names = DEFAULT_NAMES

    def place(self, label: str) -> Place:
        """A fresh database for one drain: a SQLite file, or a new PostgreSQL schema."""
        if self.backend == "sqlite":
            path = self.workdir / f"{label}.db"
            return Place("sqlite", f"sqlite:///{path}", path, "")
        assert self.schemas is not None
        url = self.schemas.fresh(label)
        return Place("postgres", url, None, url)  # a libpq URL is a conninfo as it is


@dataclass(frozen=True)
class Place:
    """Where one drain's database is."""

    backend: str
    url: str
    path: Path | None
    conninfo: str


@dataclass(frozen=True)
class Stored:
    """What one table (with its indexes) holds after a run: rows, payload and page bytes."""

    table: str
    rows: int
    payload: int
    pages: int


# Transactions begun during a drain, by replayq's storage and by the plain handler's own.
_TX_LOCK = threading.Lock()
TRANSACTIONS = [0]


def count_transaction() -> None:
    with _TX_LOCK:
        TRANSACTIONS[0] += 1


def _count_storage_transactions() -> None:
    """Wrap both storages' ``transaction`` once so that every begin is counted."""
    from replayq.storage.sqlite import SqliteStorage

    classes: list[Any] = [SqliteStorage]
    try:
        from replayq.storage.postgres import PostgresStorage

        classes.append(PostgresStorage)
    except ImportError:
        pass
    for cls in classes:
        original = cls.transaction
        if getattr(original, "_counted", False):
            continue

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            count_transaction()
            return _original(self, *args, **kwargs)

        counted._counted = True  # type: ignore[attr-defined]
        cls.transaction = counted


def open_app(
    side: str, place: Place, lines: int, names: Names = DEFAULT_NAMES
) -> tuple[replayq.App, PlainDatabase | None]:
    url = place.url
    if side == "traced":
        return make_traced_app(url, lines, names), None
    if side == "plain":
        db = PlainDatabase(place)
        return make_plain_app(url, db, lines, names), db
    return make_queue_only_app(url, names), None


def requests(jobs: int, names: Names = DEFAULT_NAMES) -> list[replayq.EnqueueRequest]:
    return [
        replayq.EnqueueRequest(names.job, {"order_id": n, "customer": n % CUSTOMERS})
        for n in range(1, jobs + 1)
    ]


@dataclass(frozen=True)
class Drained:
    seconds: float
    transactions: int
    cpu_seconds: float = 0.0  # this process's CPU time (all threads): load does not inflate it


def drain(side: str, place: Place, opts: Options) -> Drained:
    """Enqueue ``opts.jobs`` jobs on a fresh database, drain them with one Worker."""
    if place.backend == "postgres":
        replayq.App(place.url).schema_upgrade()  # PostgreSQL schemas are migrated explicitly
    app, db = open_app(side, place, opts.lines, opts.names)
    try:
        app.enqueue_many(requests(opts.jobs, opts.names))
        worker = replayq.Worker(app, burst=True, worker_id=f"bench-{side}")
        TRANSACTIONS[0] = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        stats = worker.run()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        transactions = TRANSACTIONS[0]
        if stats.succeeded != opts.jobs:
            raise SystemExit(f"{side}: {stats.succeeded} of {opts.jobs} jobs succeeded: {stats}")
        return Drained(elapsed, transactions, cpu)
    finally:
        app.close()
        if db is not None:
            db.close()


def stored(place: Place) -> dict[str, Stored]:
    """Rows, payload bytes and page bytes per table, indexes counted with their table."""
    if place.backend == "postgres":
        return _pg_stored(place)
    conn = sqlite3.connect(place.path or "")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master").fetchall())
        out: dict[str, list[int]] = {}
        for name, payload, pages in conn.execute(
            "SELECT name, SUM(payload), SUM(pgsize) FROM dbstat GROUP BY name"
        ):
            table = owner.get(name, name)
            entry = out.setdefault(table, [0, 0, 0])
            entry[1] += payload
            entry[2] += pages
        for table, entry in out.items():
            if table.startswith(("rq_", "app_")):
                entry[0] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        return {t: Stored(t, *e) for t, e in out.items()}
    finally:
        conn.close()


def _pg_stored(place: Place) -> dict[str, Stored]:
    """PostgreSQL: rows, the rows' own bytes (``pg_column_size``) and relation bytes with
    indexes and TOAST (``pg_total_relation_size``, after a VACUUM)."""
    import psycopg

    out: dict[str, Stored] = {}
    with psycopg.connect(place.conninfo, autocommit=True) as conn:
        schema = schema_of(place.url)
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            ).fetchall()
        ]
        for table in tables:
            conn.execute(f"VACUUM {table}")
            rows, payload = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t"
            ).fetchone()
            pages = conn.execute(
                "SELECT pg_total_relation_size(%s)", (f"{schema}.{table}",)
            ).fetchone()[0]
            out[table] = Stored(table, int(rows), int(payload), int(pages))
    return out


def stored_by_object(place: Place) -> dict[str, int]:
    """Bytes of each table and each index on its own (not only the trace's): SQLite's
    ``dbstat`` pages by name, PostgreSQL's ``pg_relation_size`` (TOAST counted with its
    table). Objects holding nothing (one empty page) are left out."""
    if place.backend == "sqlite":
        conn = sqlite3.connect(place.path or "")
        try:
            rows = conn.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name HAVING SUM(payload) > 0"
            ).fetchall()
        finally:
            conn.close()
        return {name: int(size) for name, size in rows}
    import psycopg

    sql = (
        "SELECT c.relname, pg_relation_size(c.oid)"
        " + COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0)"
        " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'i')"
    )
    with psycopg.connect(place.conninfo, autocommit=True) as conn:
        rows = conn.execute(sql, (schema_of(place.url),)).fetchall()
    return {name: int(size) for name, size in rows if size > 8192}


def event_bytes(place: Place) -> dict[str, tuple[int, int]]:
    """rq_events by kind: (rows, bytes of the row's text and number columns as stored)."""
    sql = (
        "SELECT kind, COUNT(*), SUM(LENGTH(data) + LENGTH(trace_id) + LENGTH(name)"
        " + COALESCE(LENGTH(step), 0) + COALESCE(LENGTH(worker_id), 0)"
        " + COALESCE(LENGTH(status), 0) + COALESCE(LENGTH(resource), 0)"
        " + COALESCE(LENGTH(output_ref), 0)) FROM rq_events GROUP BY kind"
    )
    return {kind: (int(count), int(size)) for kind, count, size in _query(place, sql)}


def blob_bytes(place: Place) -> tuple[int, int, int]:
    """rq_blobs: (rows, uncompressed bytes, stored bytes)."""
    sql = "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(SUM(LENGTH(body)), 0) FROM rq_blobs"
    row = _query(place, sql)[0]
    return int(row[0]), int(row[1]), int(row[2])


EVENTS = "SELECT COUNT(*) FROM rq_events"


def _query(place: Place, sql: str) -> list[Any]:
    if place.backend == "sqlite":
        conn = sqlite3.connect(place.path or "")
        packs.register_sqlite(conn)  # rq_events reads deflated packs through rq_pack_json
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(place.conninfo, autocommit=True) as pg:
        return pg.execute(sql).fetchall()


@dataclass
class Runs:
    times: dict[str, list[float]]
    transactions: dict[str, list[int]]
    last: dict[str, Place]
    cpu: dict[str, list[float]] = field(default_factory=dict)


def run(opts: Options) -> Runs:
    _count_storage_transactions()
    runs = Runs({side: [] for side in SIDES}, {side: [] for side in SIDES}, {})
    runs.cpu = {side: [] for side in SIDES}
    warm = replace(opts, jobs=min(200, opts.jobs), repeat=1, rtt_ms=0.0)
    for side in SIDES:  # imports, statement caches, first-file effects: not measured
        drain(side, warm.place(f"warmup-{side.replace(' ', '-')}"), warm)
    for number in range(opts.repeat):
        # Interleaved, rotating the order, so a slow spell of a busy machine hits all sides.
        order = SIDES[number % 3 :] + SIDES[: number % 3]
        for side in order:
            place = opts.place(f"{side.replace(' ', '-')}-{number}")
            drained = drain(side, place, opts)
            runs.times[side].append(drained.seconds)
            runs.transactions[side].append(drained.transactions)
            runs.cpu[side].append(drained.cpu_seconds)
            runs.last[side] = place
        print(
            f"  run {number + 1}/{opts.repeat}: "
            + ", ".join(f"{side} {runs.times[side][-1]:.2f}s" for side in SIDES),
            file=sys.stderr,
        )
    return runs


# -- profile --------------------------------------------------------------------------------


INLINE_STATEMENTS = [0]


def run_inline(
    side: str,
    path: Path,
    opts: Options,
    profiler: cProfile.Profile | None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    count: list[int] | None = None,
) -> float:
    """Lease + execute one job at a time on this thread (no executor threads); seconds of
    ``clock``. With ``count`` (a statement counter) its drain's statements go to
    ``INLINE_STATEMENTS``."""
    app, db = open_app(side, Place("sqlite", f"sqlite:///{path}", path, ""), opts.lines, opts.names)
    try:
        app.enqueue_many(requests(opts.jobs, opts.names))
        app.register_contracts()
        worker = replayq.Worker(app, worker_id=f"profile-{side}")
        SQL_TIME.clear()  # only the drain's statements count, not the setup's
        if count is not None:
            count[0] = 0
        started = clock()
        if profiler is not None:
            profiler.enable()
        while leased := worker.lease(1):
            for job in leased:
                worker.execute(job)
                worker._inflight.pop(job.id, None)  # what the executor thread does after a job
        if profiler is not None:
            profiler.disable()
        elapsed = clock() - started
        if count is not None:
            INLINE_STATEMENTS[0] = count[0]
        return elapsed
    finally:
        app.close()
        if db is not None:
            db.close()


SQL_TIME: dict[str, list[float]] = {}


def _statement(sql: str) -> str:
    words = " ".join(sql.split()).split(" ")
    if words[0] in ("INSERT", "DELETE", "REPLACE"):
        return " ".join(words[:3])
    if words[0] == "UPDATE":
        return " ".join(words[:2])
    if words[0] == "SELECT" and "FROM" in words:
        return "SELECT … FROM " + words[words.index("FROM") + 1]
    return " ".join(words[:2])


def _timed(key: str, count: int, started: float) -> None:
    entry = SQL_TIME.setdefault(key, [0, 0.0])
    entry[0] += count
    entry[1] += time.perf_counter() - started


class _TimedCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return super().execute(sql, parameters)
        finally:
            _timed(_statement(sql), 1, started)

    def executemany(self, sql: str, seq: Any, /) -> sqlite3.Cursor:
        rows = list(seq)
        started = time.perf_counter()
        try:
            return super().executemany(sql, rows)
        finally:
            _timed(_statement(sql), len(rows), started)


class _TimedConnection(sqlite3.Connection):
    """A connection that adds the time of every statement to ``SQL_TIME`` (mixed into the
    connection class the caller asks for: replayq's own counts its users)."""

    def cursor(self, factory: Any = _TimedCursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq: Any, /) -> sqlite3.Cursor:
        return self.cursor().executemany(sql, seq)


def sql_split(opts: Options) -> str:
    """Inline runs with every sqlite3 connection timing its statements (no profiler)."""
    connect = sqlite3.connect
    timed: dict[str, dict[str, list[float]]] = {}
    wall: dict[str, float] = {}
    timed_classes: dict[type, type] = {}

    def timed_connect(*a: Any, factory: type = sqlite3.Connection, **k: Any) -> Any:
        cls = timed_classes.get(factory)
        if cls is None:
            cls = type("Timed" + factory.__name__, (_TimedConnection, factory), {})
            timed_classes[factory] = cls
        return connect(*a, factory=cls, **k)

    sqlite3.connect = timed_connect  # type: ignore[assignment]
    try:
        for side in ("plain", "traced"):
            SQL_TIME.clear()
            wall[side] = run_inline(side, opts.workdir / f"sql-{side}.db", opts, None)
            timed[side] = {k: list(v) for k, v in SQL_TIME.items()}
    finally:
        sqlite3.connect = connect
    n = opts.jobs

    def inside(side: str) -> float:
        return sum(v[1] for v in timed[side].values())

    lines = [
        "",
        f"### Where the time goes: inline (lease + execute on one thread), {n} jobs, no profiler",
        "",
        "| µs per job | plain | traced | traced - plain |",
        "|---|---:|---:|---:|",
    ]
    for label, of in (
        ("wall", lambda side: wall[side]),
        ("inside sqlite3 (execute, executemany)", inside),
        ("outside sqlite3 (Python)", lambda side: wall[side] - inside(side)),
    ):
        a, b = of("plain") * 1e6 / n, of("traced") * 1e6 / n
        lines.append(f"| {label} | {a:,.0f} | {b:,.0f} | {b - a:,.0f} |")
    lines += [
        "",
        "| statement | plain /job | plain µs/job | traced /job | traced µs/job |",
        "|---|---:|---:|---:|---:|",
    ]
    keys = sorted(
        set(timed["plain"]) | set(timed["traced"]),
        key=lambda k: -timed["traced"].get(k, [0, 0.0])[1],
    )
    for key in keys:
        a = timed["plain"].get(key, [0, 0.0])
        b = timed["traced"].get(key, [0, 0.0])
        if max(a[1], b[1]) * 1e6 / n < 5 or key.startswith("PRAGMA"):
            continue
        lines.append(
            f"| `{key}` | {a[0] / n:.1f} | {a[1] * 1e6 / n:,.0f} "
            f"| {b[0] / n:.1f} | {b[1] * 1e6 / n:,.0f} |"
        )
    return "\n".join(lines)


def _watch() -> list[tuple[str, Any]]:
    """Recording functions whose inclusive time the profile lists: (label, code or name)."""
    from replayq import codec, worker
    from replayq.clock import HybridLogicalClock
    from replayq.recording import blobs, calls, context, effects, state, steps
    from replayq.storage.sql_transaction import SqlTransaction

    ctx, view = context.Context, state.StateView
    return [
        ("steps.StepBoundary (its end, incl. its commit)", steps.StepBoundary.__exit__.__code__),
        ("Context.commit_now (a step's transaction)", ctx.commit_now.__code__),
        ("ctx.call (calls.record_call)", calls.record_call.__code__),
        ("Context.encode (JSON check, size, sha256)", ctx.encode.__code__),
        ("Context.event (build a TraceEvent)", ctx.event.__code__),
        ("EffectRunner.run (claim + effect + record)", effects.EffectRunner.run.__code__),
        ("StateView.get", view.get.__code__),
        ("StateView.put (read head, delta, event)", view.put.__code__),
        ("state.read_entity", state.read_entity.__code__),
        ("blobs.put_bytes (sha256, zstd, insert)", blobs.put_bytes.__code__),
        ("SqlTransaction.trace_append", SqlTransaction.trace_append.__code__),
        ("codec.dumps", codec.dumps.__code__),
        ("codec._check (walk every value)", codec._check.__code__),
        ("HybridLogicalClock.tick", HybridLogicalClock.tick.__code__),
        ("Worker.lease", worker.Worker.lease.__code__),
        ("Worker._succeed", worker.Worker._succeed.__code__),
        ("sqlite3 execute", "<method 'execute' of 'sqlite3.Connection' objects>"),
        ("sqlite3 executemany", "<method 'executemany' of 'sqlite3.Cursor' objects>"),
    ]


def profile_report(opts: Options) -> str:
    jobs = opts.jobs
    seconds: dict[str, float] = {}
    stats: dict[str, pstats.Stats] = {}
    for side in ("plain", "traced"):
        profiler = cProfile.Profile()
        seconds[side] = run_inline(side, opts.workdir / f"profile-{side}.db", opts, profiler)
        stats[side] = pstats.Stats(profiler)
    lines = [
        "",
        f"### cProfile, inline (lease + execute on one thread), {jobs} jobs",
        "",
        f"- plain: {seconds['plain'] / jobs * 1e6:,.0f} µs/job under the profiler; "
        f"traced: {seconds['traced'] / jobs * 1e6:,.0f} µs/job",
        "",
        "| traced: function (inclusive) | calls/job | µs/job | plain µs/job |",
        "|---|---:|---:|---:|",
    ]

    def lookup(st: pstats.Stats, target: Any) -> tuple[float, float]:
        calls = total = 0.0
        raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
        for (filename, lineno, name), (_, ncalls, _, cumulative, _) in raw.items():
            if isinstance(target, str):
                hit = name == target
            else:
                hit = (filename, lineno, name) == (
                    target.co_filename,
                    target.co_firstlineno,
                    target.co_name,
                )
            if hit:
                calls += ncalls
                total += cumulative
        return calls, total

    for label, target in _watch():
        calls, total = lookup(stats["traced"], target)
        if not calls:
            continue
        _, plain_total = lookup(stats["plain"], target)
        lines.append(
            f"| {label} | {calls / jobs:.1f} | {total / jobs * 1e6:,.0f} "
            f"| {plain_total / jobs * 1e6:,.0f} |"
        )
    lines += ["", "Top 15 by own time (traced):", "", "| function | calls/job | own µs/job |"]
    lines.append("|---|---:|---:|")
    entries = sorted(
        stats["traced"].stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )
    for (filename, lineno, name), (_, ncalls, tottime, _, _) in entries[:15]:
        where = f"{Path(filename).name}:{lineno} {name}" if lineno else name
        lines.append(f"| `{where}` | {ncalls / jobs:.1f} | {tottime / jobs * 1e6:,.0f} |")
    return "\n".join(lines)


# -- CPU time and statements, inline -----------------------------------------------------


def cpu_figures(opts: Options) -> dict[str, Any]:
    """Inline runs (lease + execute on this thread), plain and traced interleaved
    ``opts.repeat`` times: the least thread CPU time per job (what a loaded machine
    inflates least), the SQL statements per job (``sqlite3`` trace callback) and, from
    one more run of each under cProfile, the Python function calls per job."""
    connect = sqlite3.connect
    counted = [0]

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda _sql: counted.__setitem__(0, counted[0] + 1))
        return conn

    cpu: dict[str, list[float]] = {"plain": [], "traced": []}
    statements: dict[str, float] = {}
    for side in ("plain", "traced"):  # warm-up: imports, caches
        run_inline(side, opts.workdir / f"cpu-warm-{side}.db", replace(opts, jobs=100), None)
    for number in range(opts.repeat):
        for side in ("plain", "traced") if number % 2 == 0 else ("traced", "plain"):
            path = opts.workdir / f"cpu-{side}-{number}.db"
            sqlite3.connect = counting  # type: ignore[assignment]
            try:
                started = time.thread_time()
                counted[0] = 0
                run_inline(side, path, opts, None, clock=time.thread_time, count=counted)
            finally:
                sqlite3.connect = connect
            cpu[side].append(time.thread_time() - started)
            statements[side] = INLINE_STATEMENTS[0] / opts.jobs
    calls: dict[str, float] = {}
    for side in ("plain", "traced"):  # Python function calls: the same on a loaded machine
        profiler = cProfile.Profile()
        run_inline(side, opts.workdir / f"calls-{side}.db", opts, profiler)
        calls[side] = pstats.Stats(profiler).total_calls / opts.jobs  # type: ignore[attr-defined]
    best = {side: min(values) / opts.jobs * 1e6 for side, values in cpu.items()}
    return {
        "benchmark": "context_overhead --cpu",
        "backend": "sqlite",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load_average(),
        "jobs": opts.jobs,
        "repeat": opts.repeat,
        "cpu_us_per_job": {side: round(v, 1) for side, v in best.items()},
        "cpu_us_per_job_runs": {
            side: [round(v / opts.jobs * 1e6, 1) for v in values] for side, values in cpu.items()
        },
        "cpu_overhead_pct": round((best["traced"] / best["plain"] - 1) * 100, 1),
        "statements_per_job": {side: round(v, 2) for side, v in statements.items()},
        "python_calls_per_job": {side: round(v) for side, v in calls.items()},
    }


# -- report ---------------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if len(values) < 2:
        return ""
    return f"{fmt(min(values))} to {fmt(max(values))}"


def overheads(runs: Runs, n: int) -> tuple[list[float], list[float], list[float]]:
    """Per run (the sides of one run ran back to back): µs/job, % of plain, % of the handler."""
    times = runs.times
    per_run = [
        (tr - pl, tr / pl - 1, (tr - pl) / (pl - q) if pl > q else float("nan"))
        for tr, pl, q in zip(times["traced"], times["plain"], times["queue only"], strict=True)
    ]
    return (
        [d / n * 1e6 for d, _, _ in per_run],
        [p for _, p, _ in per_run],
        [h for _, _, h in per_run],
    )


def figures(opts: Options, runs: Runs) -> dict[str, Any]:
    """The ``--json`` object: one comparable set of figures for this commit."""
    n, med = opts.jobs, statistics.median
    us, pct, handler_pct = overheads(runs, n)
    out: dict[str, Any] = {
        "benchmark": "context_overhead",
        "backend": opts.backend,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load_average(),
        "jobs": n,
        "repeat": opts.repeat,
        "rtt_ms_added": opts.rtt_ms,
        **({} if opts.names == DEFAULT_NAMES else {"names": "other"}),
        "sides": {},
        "overhead_pct": round(med(pct) * 100, 1),
        "overhead_pct_runs": [round(p * 100, 1) for p in pct],
        "overhead_us_per_job": round(med(us), 1),
        "overhead_of_handler_pct": round(med(handler_pct) * 100, 1),
        # The same from CPU time (this process, every thread): what load does not inflate.
        "cpu_overhead_pct": round(
            med([t / p - 1 for t, p in zip(runs.cpu["traced"], runs.cpu["plain"], strict=True)])
            * 100,
            1,
        ),
    }
    for side in SIDES:
        tables = stored(runs.last[side])
        # The trace's rows: one per event (rq_events, before migration 0009) or one per
        # commit and job (rq_trace packs), and the resource index's entries beside them.
        events = tables.get("rq_trace") or tables.get("rq_events")
        index = tables.get("rq_trace_resources")
        out["sides"][side] = {
            "us_per_job": round(med(runs.times[side]) / n * 1e6, 1),
            "us_per_job_runs": [round(t / n * 1e6, 1) for t in runs.times[side]],
            "cpu_us_per_job": round(med(runs.cpu[side]) / n * 1e6, 1),
            "transactions_per_job": round(med(runs.transactions[side]) / n, 2),
            "event_rows_per_job": round(events.rows / n, 2) if events else 0,
            "events_per_job": round(_query(runs.last[side], EVENTS)[0][0] / n, 2),
            "trace_index_rows_per_job": round(index.rows / n, 2) if index else 0,
            "rows_per_job": round(sum(t.rows for t in tables.values()) / n, 2),
            "bytes_per_job": round(sum(t.pages for t in tables.values()) / n),
            "payload_bytes_per_job": round(sum(t.payload for t in tables.values()) / n),
            "bytes_per_job_by_object": {
                name: round(size / n)
                for name, size in sorted(stored_by_object(runs.last[side]).items())
            },
        }
    return out


def report(opts: Options, runs: Runs) -> str:
    n = opts.jobs
    times, last = runs.times, runs.last
    med = statistics.median
    backend = "SQLite" if opts.backend == "sqlite" else "PostgreSQL"
    lines = [f"## Recording overhead — {backend}, {n} jobs, median of {opts.repeat}", ""]
    lines += [f"- {key}: {value}" for key, value in machine(opts.workdir)]
    lines += [f"- commit: {commit()}"]
    if opts.rtt_ms:
        lines += [f"- every PostgreSQL round trip {opts.rtt_ms} ms longer (latency_proxy.py)"]
    lines += [
        f"- the call's response: {opts.lines} lines, "
        f"{len(json.dumps(quote(1, opts.lines)))} bytes of JSON",
        "",
        "| side | seconds (median) | spread | jobs/s | µs/job |",
        "|---|---:|---|---:|---:|",
    ]
    for side in SIDES:
        t = times[side]
        lines.append(
            f"| {side} | {med(t):.3f} | {spread(t, lambda v: f'{v:.3f}')} "
            f"| {n / med(t):,.0f} | {med(t) / n * 1e6:,.0f} |"
        )
    us, pct, handler_pct = overheads(runs, n)
    tx = {side: med(runs.transactions[side]) / n for side in SIDES}
    lines += [
        "",
        "| overhead of recording | median | spread over runs | aim |",
        "|---|---:|---|---|",
        f"| µs per job | {med(us):,.0f} | {spread(us, lambda v: f'{v:,.0f}')} | |",
        f"| % of the plain job, queue included | {med(pct):.0%} "
        f"| {spread(pct, lambda v: f'{v:.0%}')} | ≤ {AIM:.0%} |",
        f"| % of the plain handler's own time (queue-only time subtracted) "
        f"| {med(handler_pct):.0%} | {spread(handler_pct, lambda v: f'{v:.0%}')} | |",
        "",
        "| transactions per job (begun during the drain) | "
        + " | ".join(f"{side}: {tx[side]:.2f}" for side in SIDES)
        + " |",
    ]
    traced, plain = stored(last["traced"]), stored(last["plain"])
    lines += [
        "",
        f"Bytes stored per job (last run; SQLite: `dbstat` payload = row bytes, pages = bytes "
        f"of the table's and its indexes' pages, after a checkpoint; PostgreSQL: "
        f"`pg_column_size` of the rows and `pg_total_relation_size` after a VACUUM; {n} jobs):",
        "",
        "| side | table (+ indexes) | rows/job | payload B/job | pages B/job |",
        "|---|---|---:|---:|---:|",
    ]
    for side, tables in (("traced", traced), ("plain", plain)):
        shown = [
            s
            for s in tables.values()
            if s.table.startswith("app_")
            or s.table in ("rq_events", "rq_trace", "rq_trace_resources", "rq_blobs")
            or s.table in ("rq_entity_versions", "rq_entities")
            or s.table in ("rq_idempotency", "rq_jobs")
        ]
        for s in sorted(shown, key=lambda s: s.table):
            lines.append(
                f"| {side} | {s.table} | {s.rows / n:.1f} | {s.payload / n:,.0f} "
                f"| {s.pages / n:,.0f} |"
            )
        total_pages = sum(s.pages for s in tables.values())
        lines.append(f"| {side} | whole file | | | {total_pages / n:,.0f} |")
    kinds = event_bytes(last["traced"])
    blobs = blob_bytes(last["traced"])
    lines += [
        "",
        "| traced: what the recording adds | per job |",
        "|---|---:|",
    ]
    for kind, (count, size) in sorted(kinds.items()):
        lines.append(f"| `{kind}` events | {count / n:.1f} |")
        lines.append(f"| rq_events `{kind}` text bytes (`SUM(LENGTH(...))`) | {size / n:,.0f} |")
    lines += [
        f"| rq_blobs rows | {blobs[0] / n:.2f} |",
        f"| rq_blobs bytes before zstd | {blobs[1] / n:,.0f} |",
        f"| rq_blobs bytes stored (`SUM(LENGTH(body))`) | {blobs[2] / n:,.0f} |",
        f"| whole file, traced - plain | "
        f"{(sum(s.pages for s in traced.values()) - sum(s.pages for s in plain.values())) / n:,.0f}"
        " |",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per drain")
    parser.add_argument("--repeat", type=int, default=3, help="drains per side (median)")
    parser.add_argument("--lines", type=int, default=32, help="lines in the call's response")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (--backend postgres)")
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="PostgreSQL: add this to every round trip (a proxy process), as across a network",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    parser.add_argument("--profile", action="store_true", help="add an inline cProfile breakdown")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument(
        "--names",
        choices=tuple(NAMES),
        default="default",
        help="the handler's names: the default's (in packs.DICTIONARY_2) or others",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="inline runs only: least thread CPU µs/job, SQL statements and Python calls/job",
    )
    args = parser.parse_args(argv)
    if args.rtt_ms and args.backend != "postgres":
        parser.error("--rtt-ms is for --backend postgres")
    with delayed_url(args.pg_url, args.rtt_ms) as pg_url:
        measure(args, pg_url)


def measure(args: argparse.Namespace, pg_url: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="replayq-ctx-bench-", dir=args.dir))
    schemas = PgSchemas(pg_url) if args.backend == "postgres" else None
    opts = Options(
        args.jobs,
        args.repeat,
        args.lines,
        workdir,
        args.backend,
        schemas,
        args.rtt_ms,
        NAMES[args.names],
    )
    try:
        if args.cpu:
            print(json.dumps(cpu_figures(opts), indent=1))
            return
        runs = run(opts)
        if args.json:
            print(json.dumps(figures(opts, runs), indent=1))
            return
        text = report(opts, runs)
        if args.profile:
            text += "\n" + sql_split(opts) + "\n" + profile_report(opts)
        print(text)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            if schemas is not None:
                schemas.drop_all()


if __name__ == "__main__":
    main()
