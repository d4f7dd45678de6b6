"""An enqueue on SQLite is one statement committed by itself (``SqliteStorage.autocommit``,
no ``BEGIN``/``COMMIT``): a fault of the file met by that statement is reported as one
met by a transaction was (``DatabaseUnavailableError``, the driver's error as its cause),
leaves neither the job's row nor its ``job.enqueued`` pack, and leaves the app's
connection out of any transaction and usable: once the fault clears, the next enqueue
works, with exactly one ``job.enqueued``.

Real faults on real files: a write lock another process holds past ``busy_timeout``, a
full tmpfs (needs root), and a FUSE mount turned read-only or failing ``EIO``
(``tests/faultfs.py``; the fixtures of ``test_sqlite_faults.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from tests.acceptance.test_sqlite_faults import (  # noqa: F401 - fixtures
    FaultyDisk,
    faulty_disk,
    small_disk,
)

HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def write_lock_held(database: Path) -> Iterator[None]:
    """Another process holds the file's write lock (``BEGIN IMMEDIATE``) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, str(database)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(30) == 0
        holder.stdout.close()


def _app(url: str) -> replayq.App:
    app = replayq.App(url)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def _rows_and_enqueued(database: Path) -> tuple[int, list[int]]:
    """The jobs in the file, and each job's count of ``job.enqueued`` packs (format 3), as
    readers see them (``rq_packs``: since migration 0023 that pack is in the job's row)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        rows = int(conn.execute("SELECT COUNT(*) FROM rq_jobs").fetchone()[0])
        counts = [
            int(n)
            for (n,) in conn.execute(
                "SELECT (SELECT COUNT(*) FROM rq_packs AS t WHERE t.job_id = j.id"
                " AND substr(t.events, 1, 1) = x'03') FROM rq_jobs AS j ORDER BY j.id"
            )
        ]
    return rows, counts


def _usable_after(app: replayq.App, database: Path, rows_before: int) -> None:
    """The app's connection is out of any transaction, and the next enqueue works."""
    assert not app.storage._connection().in_transaction  # type: ignore[attr-defined]
    job_id = app.enqueue("noop", {"n": 1000})
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
    rows, counts = _rows_and_enqueued(database)
    assert rows == rows_before + 1
    assert counts == [1] * rows, "every job has exactly one job.enqueued pack"


def test_a_write_lock_held_past_the_busy_timeout_fails_the_enqueue_cleanly(
    tmp_path: Path,
) -> None:
    database = tmp_path / "q.db"
    app = _app(f"sqlite:///{database}?busy_timeout=200")
    app.enqueue("noop", {"n": 0})
    with write_lock_held(database):
        with pytest.raises(replayq.DatabaseUnavailableError, match="database is locked") as info:
            app.enqueue("noop", {"n": 1})
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert _rows_and_enqueued(database) == (1, [1])
    _usable_after(app, database, 1)
    app.close()


def test_a_full_disk_fails_the_enqueue_cleanly_and_it_works_once_space_is_freed(
    small_disk: Path,  # noqa: F811
) -> None:
    database = small_disk / "q.db"
    app = _app(f"sqlite:///{database}")
    app.enqueue("noop", {"n": 0})
    with sqlite3.connect(database) as checkpoint:
        checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ballast = small_disk / "ballast"
    with ballast.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
    returned = 0
    with pytest.raises(replayq.DatabaseUnavailableError, match="full") as info:
        for n in range(1, 100_000):
            app.enqueue("noop", {"n": n})
            returned += 1
    assert "cannot rollback" not in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.Error)
    # A second try while the disk is still full fails the same way, and writes nothing.
    with pytest.raises(replayq.DatabaseUnavailableError, match="full"):
        app.enqueue("noop", {"n": -1})
    rows, counts = _rows_and_enqueued(database)
    assert rows == 1 + returned, "every enqueue that returned is a job; no other"
    assert counts == [1] * rows
    ballast.unlink()
    _usable_after(app, database, rows)
    app.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["readonly", "eio"])
def test_a_read_only_or_failing_disk_fails_the_enqueue_cleanly(
    faulty_disk: FaultyDisk,  # noqa: F811
    fault: str,
) -> None:
    database = faulty_disk.mount / "q.db"
    app = _app(f"sqlite:///{database}")
    app.enqueue("noop", {"n": 0})
    faulty_disk.set(fault)
    try:
        for n in (1, 2):  # the second on what the first left (a discarded connection)
            with pytest.raises(replayq.DatabaseUnavailableError) as info:
                app.enqueue("noop", {"n": n})
            assert isinstance(info.value.__cause__, sqlite3.Error)
    finally:
        faulty_disk.set("ok")
    assert _rows_and_enqueued(database) == (1, [1])
    _usable_after(app, database, 1)
    app.close()
