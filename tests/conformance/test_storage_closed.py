"""A storage used after its ``close()`` fails the same way on every backend: a
``StorageError`` saying it is closed — never the driver's own error (SQLite's
``ProgrammingError``), never ``DatabaseUnavailableError`` (PostgreSQL's closed pool was
one: a worker would have waited forever for a storage that cannot come back).

A block another thread has open when ``close()`` runs either commits whole (PostgreSQL:
the pool lets it finish) or raises that error and commits nothing (SQLite: its
connection is closed by its own thread as the block ends); never half, never a raw
driver error, never a crash.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replayq.errors import DatabaseUnavailableError, StorageClosedError, StorageError
from replayq.storage import open_storage
from replayq.storage.params import JobFilter, JobInsert
from replayq.storage.protocol import Autocommit, Listener, SnapshotRead, Storage

T0 = 1_700_000_000.0


def insert(message_id: str) -> JobInsert:
    return JobInsert(
        job_type="t",
        queue="default",
        payload_json="{}",
        priority=0,
        run_at=T0,
        now=T0,
        max_attempts=3,
        trace_id="trace",
        hlc=1,
        message_id=message_id,
    )


def _write(storage: Storage) -> None:
    with storage.transaction() as tx:
        tx.job_insert(insert("after close"))


def _read(storage: Storage) -> None:
    with storage.transaction(readonly=True) as tx:
        tx.job_list(JobFilter())


def _autocommit(storage: Storage) -> None:
    assert isinstance(storage, Autocommit)
    with storage.autocommit() as tx:
        tx.job_insert(insert("after close"))


def _listen(storage: Storage) -> None:
    assert isinstance(storage, Listener)
    storage.listen(lambda queue: None).close()


def _snapshot_read(storage: Storage) -> None:
    assert isinstance(storage, SnapshotRead)
    with storage.snapshot_read() as tx:
        tx.job_list(JobFilter())


USES: dict[str, Callable[[Storage], Any]] = {
    "write": _write,
    "read": _read,
    "autocommit": _autocommit,
    "snapshot_read": _snapshot_read,
    "migration_status": lambda storage: storage.migration_status(),
    "migrate": lambda storage: storage.migrate(T0),
    "listen": _listen,
}


@pytest.mark.parametrize("use", sorted(USES))
def test_every_use_of_a_closed_storage_raises_storage_error_saying_so(
    db_url: str, use: str
) -> None:
    storage = open_storage(db_url)
    storage.migrate(T0)
    storage.close()
    with pytest.raises(StorageError, match="storage is closed") as raised:
        USES[use](storage)
    assert not isinstance(raised.value, DatabaseUnavailableError)  # no outage to wait out
    storage.close()  # closing again is harmless


def test_a_block_open_on_another_thread_at_close_commits_whole_or_raises_and_commits_nothing(
    db_url: str,
) -> None:
    storage = open_storage(db_url)
    storage.migrate(T0)
    inside, closed = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def write_across_the_close() -> None:
        try:
            with storage.transaction() as tx:
                tx.job_insert(insert("before close"))
                inside.set()
                closed.wait(10)
                tx.job_insert(insert("after close"))
        except BaseException as exc:  # judged by the test's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    writer = threading.Thread(target=write_across_the_close)
    writer.start()
    assert inside.wait(10)
    closer = threading.Thread(target=storage.close)
    closer.start()
    closer.join(0.5)  # SQLite's returns at once; PostgreSQL's waits for the block to end
    closed.set()
    writer.join(10)
    closer.join(10)
    [error] = outcome
    if error is not None:
        # The closed storage's own error: not the driver's, not an outage to wait out.
        assert type(error) is StorageClosedError, repr(error)
        assert "storage is closed" in str(error)
    reader = open_storage(db_url)
    try:
        with reader.transaction(readonly=True) as tx:
            kept = sorted(job.message_id or "" for job in tx.job_list(JobFilter()))
    finally:
        reader.close()
    assert kept == ([] if error is not None else ["after close", "before close"])


class _PausedAfterClosing:
    """``SqliteStorage._all_lock`` whose release pauses ``close()`` once it has closed the
    connections, before it forgets this thread's (``_local``): the worst moment for a
    block that begins on another thread."""

    def __init__(self, storage: Any) -> None:
        self._lock = threading.Lock()
        self._storage = storage
        self.paused, self.resume = threading.Event(), threading.Event()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        if self._storage._closed and not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(10)


def test_a_block_begun_while_close_runs_raises_storage_error_not_the_drivers(
    tmp_path: Path,
) -> None:
    """SQLite alone (PostgreSQL's pool hands out no closed connection): this thread's
    connection is closed by ``close()`` on another thread, which has not yet forgotten it
    when this thread begins its next block: that block raises the closed storage's
    ``StorageError``, not ``sqlite3.ProgrammingError`` (``Cannot operate on a closed
    database``) from a look at the closed connection."""
    storage = open_storage(f"sqlite:///{tmp_path / 'closing.db'}")
    storage.migrate(T0)
    _read(storage)  # this thread's connection, opened and idle
    gate = _PausedAfterClosing(storage)
    storage._all_lock = gate  # type: ignore[attr-defined]
    closer = threading.Thread(target=storage.close)
    closer.start()
    try:
        assert gate.paused.wait(10)
        for use in ("read", "write", "autocommit", "snapshot_read"):
            with pytest.raises(StorageError, match="storage is closed"):
                USES[use](storage)
    finally:
        gate.resume.set()
        closer.join(10)


_CLOSE_UNDER_STATEMENTS = """
import sys, threading, time
from replayq.errors import StorageError
from replayq.storage import open_storage
from tests.conformance.test_storage_closed import T0, _read, _write

url, rounds = sys.argv[1], int(sys.argv[2])
open_storage(url).migrate(T0)
for n in range(rounds):
    storage = open_storage(url)
    errors = []

    def use():
        try:
            while True:
                _write(storage)
                _read(storage)
        except StorageError as exc:
            errors.append(exc)

    user = threading.Thread(target=use)
    user.start()
    time.sleep((n % 7) / 2000)
    storage.close()
    user.join(10)
    assert not user.is_alive(), "a block went on after close()"
    assert "storage is closed" in str(errors[0]), errors
print("ok", rounds)
"""


def test_close_on_one_thread_while_another_runs_statements_never_crashes_the_process(
    tmp_path: Path,
) -> None:
    """SQLite: ``close()`` used to close every connection at once, also one whose thread
    was inside a statement (waiting for the write lock, or stepping): Python 3.11's
    sqlite3 freed the connection under that statement and the process died of a
    segmentation fault (a worker closed as a handler past its grace acked, in CI). Now
    ``close()`` closes what no block is in, and a block's own thread closes its connection
    as the block ends. A process closes its storage under a thread's writes and reads,
    hundreds of times: it exits cleanly, each time the thread ends with the closed
    storage's ``StorageError``."""
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_UNDER_STATEMENTS, f"sqlite:///{tmp_path / 'c.db'}", "300"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.split() == ["ok", "300"]
