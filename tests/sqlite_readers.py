"""Readers of a SQLite file that never pause, for the tests of the WAL's bound.

SQLite's automatic checkpoint restarts the WAL only when no reader is using it; these
readers see to it that one always is (a dashboard that polls, a report that never ends).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def readers_that_never_pause(database: Path, *, count: int, hold: float) -> Iterator[None]:
    """``count`` threads, each in read transactions of ``hold`` seconds one after another,
    staggered so that one is always open; ``hold`` = 0: one read transaction each, kept
    open until the block ends. Each has its first transaction open when this enters."""
    stop = threading.Event()
    opened = threading.Barrier(count + 1)

    def read(offset: float) -> None:
        uri = f"file:{database}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, isolation_level=None)) as conn:
            time.sleep(offset)
            conn.execute("BEGIN")
            conn.execute("SELECT COUNT(*) FROM rq_jobs").fetchone()
            opened.wait()
            while not stop.is_set():
                if hold:
                    time.sleep(hold)
                    conn.execute("COMMIT")
                    conn.execute("BEGIN")
                    conn.execute("SELECT COUNT(*) FROM rq_jobs").fetchone()
                else:
                    stop.wait(0.05)
            conn.execute("COMMIT")

    threads = [
        threading.Thread(target=read, args=(n * hold / count,), daemon=True) for n in range(count)
    ]
    for thread in threads:
        thread.start()
    opened.wait()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
