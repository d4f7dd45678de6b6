"""The two SQLite baselines replayq is measured against, runnable as a worker subprocess.

* ``raw``: the storage limit. A plain ``sqlite3`` loop over a minimal jobs table
  with replayq's default durability (WAL, ``synchronous=NORMAL``, busy timeout)
  that claims ONE job per transaction and completes it in a second one:
  ``BEGIN IMMEDIATE; SELECT; UPDATE → running; COMMIT`` then
  ``BEGIN IMMEDIATE; UPDATE → done (compare-and-set on owner); COMMIT``.
  No trace, no contracts, no threads.
* ``huey``: Huey's SQLite storage (``huey.storage.SqliteStorage``) with the same
  ``synchronous=NORMAL`` (Huey leaves SQLite's default, FULL in WAL mode, unless
  told). Its worker is a loop of ``huey.dequeue()`` + ``huey.execute(task)`` —
  what Huey's consumer does per task, without the consumer's polling sleeps.

Usage (the throughput script does this)::

    python benchmarks/sqlite_baselines.py raw-drain  PATH [SYNC]
    python benchmarks/sqlite_baselines.py huey-drain PATH [SYNC]

A drain prints the number of jobs it completed and exits when the queue is empty.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import uuid
from typing import Any

BUSY_TIMEOUT_MS = 5000  # replayq's default (storage/sqlite/__init__.py)

RAW_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    payload        TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    run_at         REAL    NOT NULL,
    owner_token    TEXT,
    lease_deadline REAL,
    finished_at    REAL
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (run_at, id) WHERE state = 'queued';
"""


# -- raw sqlite3 ----------------------------------------------------------------------------


def raw_connect(path: str, synchronous: str = "NORMAL") -> sqlite3.Connection:
    """A connection set up exactly as replayq sets up its own."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def raw_enqueue(path: str, jobs: int, synchronous: str = "NORMAL") -> None:
    """Insert ``jobs`` queued rows in one transaction."""
    conn = raw_connect(path, synchronous)
    conn.executescript(RAW_SCHEMA)
    now = time.time()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO jobs (payload, state, run_at) VALUES (?, 'queued', ?)",
        [(json.dumps({"n": n}), now) for n in range(jobs)],
    )
    conn.execute("COMMIT")
    conn.close()


def raw_drain(path: str, synchronous: str = "NORMAL") -> int:
    """Claim one job per transaction, run it (no-op), complete it; until none is left."""
    conn = raw_connect(path, synchronous)
    done = 0
    while True:
        now = time.time()
        token = uuid.uuid4().hex
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "SELECT id, payload FROM jobs WHERE state = 'queued' AND run_at <= ? "
            "ORDER BY run_at, id LIMIT 1",
            (now,),
        ).fetchone()
        if row is None:
            conn.execute("COMMIT")
            break
        job_id, payload = row
        conn.execute(
            "UPDATE jobs SET state = 'running', owner_token = ?, lease_deadline = ? "
            "WHERE id = ? AND state = 'queued'",
            (token, now + 30.0, job_id),
        )
        conn.execute("COMMIT")
        json.loads(payload)  # the no-op job
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE jobs SET state = 'done', finished_at = ?, owner_token = NULL "
            "WHERE id = ? AND owner_token = ? AND state = 'running'",
            (time.time(), job_id, token),
        )
        conn.execute("COMMIT")
        done += 1
    conn.close()
    return done


def raw_count_done(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'done'").fetchone()[0])
    finally:
        conn.close()


# -- Huey -----------------------------------------------------------------------------------


def huey_version() -> str:
    from importlib.metadata import version

    return version("huey")


def huey_app(path: str, synchronous: str = "NORMAL") -> Any:
    """A Huey on its SQLite storage at ``synchronous`` (Huey's own API offers only OFF/FULL)."""
    from huey import Huey
    from huey.storage import SqliteStorage

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn = super()._create_connection()
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            return conn

    huey = Huey("bench", storage_class=Storage, filename=path, timeout=BUSY_TIMEOUT_MS / 1000)

    @huey.task(name="noop")
    def noop(n: int) -> None:
        return None

    huey.noop_task = noop
    return huey


def huey_enqueue(path: str, jobs: int, synchronous: str = "NORMAL") -> float:
    """Enqueue ``jobs`` no-op tasks one by one (Huey has no bulk enqueue); returns seconds."""
    huey = huey_app(path, synchronous)
    started = time.perf_counter()
    for n in range(jobs):
        huey.noop_task(n)
    elapsed = time.perf_counter() - started
    huey.storage.close()
    return elapsed


def huey_drain(path: str, synchronous: str = "NORMAL") -> int:
    """What Huey's consumer does per task: dequeue (one write), execute (one more write)."""
    huey = huey_app(path, synchronous)
    done = 0
    while True:
        task = huey.dequeue()
        if task is None:
            break
        huey.execute(task)
        done += 1
    huey.storage.close()
    return done


def huey_pending(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM task").fetchone()[0])
    finally:
        conn.close()


DRAINS = {"raw-drain": raw_drain, "huey-drain": huey_drain}

if __name__ == "__main__":
    # Huey names a task after its module: import this file under its own name, as the
    # enqueuing process did, rather than run it as ``__main__``.
    import sqlite_baselines

    command, db_path, *rest = sys.argv[1:]
    print(sqlite_baselines.DRAINS[command](db_path, *rest))
