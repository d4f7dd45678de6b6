"""A process's threads that write one SQLite file queue on a lock of the process's
(``storage/sqlite``, ``_WRITERS``) instead of meeting on SQLite's lock, where the one
refused sleeps in SQLite's busy handler (1 ms, 2, 5, 10 ...) however soon it is free.

Real files, real threads. The waiting thread's own connection is told not to wait at all
(``PRAGMA busy_timeout = 0``): had it reached SQLite's lock while the other thread held
it, its ``BEGIN IMMEDIATE`` would fail at once (``database is locked``). That it goes
through, after the other's commit, shows it waited in the queue.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from replayq.errors import DatabaseUnavailableError, StorageError
from replayq.storage.sqlite import SqliteStorage

HOLD = 0.2  # seconds the first writer keeps its transaction open after the second asks


def _writes_while_another_holds(first: SqliteStorage, second: SqliteStorage) -> list[str]:
    """``first`` writes and holds its transaction; meanwhile ``second`` (on another thread,
    its connection never waiting on SQLite's lock) writes too. What happened, in order."""
    seen: list[str] = []
    holding, asked = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        with first.transaction() as tx:
            tx.connection.execute("INSERT INTO t VALUES ('first')")
            holding.set()
            asked.wait(10)
            time.sleep(HOLD)
            seen.append("first commits")

    def write() -> None:
        conn = second._connection()  # this thread's
        conn.execute("PRAGMA busy_timeout = 0")
        holding.wait(10)
        asked.set()
        try:
            with second.transaction() as tx:
                seen.append("second began")
                tx.connection.execute("INSERT INTO t VALUES ('second')")
        except BaseException as exc:  # raised again by the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=hold), threading.Thread(target=write)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    if failures:
        raise failures[0]
    return seen


def _file(tmp_path: Path) -> str:
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (who TEXT)")
    conn.close()
    return f"sqlite:///{path}"


def test_a_second_thread_waits_for_the_first_writer_in_the_process_queue(tmp_path: Path) -> None:
    storage = SqliteStorage(_file(tmp_path))
    try:
        assert _writes_while_another_holds(storage, storage) == ["first commits", "second began"]
        conn = storage._connection()
        assert conn.execute("SELECT who FROM t ORDER BY rowid").fetchall() == [
            ("first",),
            ("second",),
        ]
    finally:
        storage.close()


def test_two_storages_of_one_file_in_one_process_share_the_queue(tmp_path: Path) -> None:
    """Two ``App``s of one process on one file (a worker and a web page, say) find the
    same lock: the file's resolved path names it."""
    url = _file(tmp_path)
    first, second = SqliteStorage(url), SqliteStorage(url.replace("q.db", "./q.db"))
    try:
        assert _writes_while_another_holds(first, second) == ["first commits", "second began"]
    finally:
        first.close()
        second.close()


def test_without_the_queue_the_second_writer_meets_sqlites_lock(tmp_path: Path) -> None:
    """What the queue spares: a writer that reaches SQLite's lock while another
    connection holds it, with no wait of its own, is refused at once (the condition the
    tests above rely on). Here the second storage's lock is one of its own, not the
    file's: as for a writer in another process."""
    url = _file(tmp_path)
    first = SqliteStorage(url)
    second = SqliteStorage(url)
    second._writer = threading.Lock()
    try:
        with pytest.raises(DatabaseUnavailableError, match="locked"):
            _writes_while_another_holds(first, second)
    finally:
        first.close()
        second.close()


def _write_seconds(storage: SqliteStorage) -> float:
    """How long a write of a new thread (a connection of its own) takes; raises its error."""
    took: list[float] = []
    failures: list[BaseException] = []

    def write() -> None:
        start = time.monotonic()
        try:
            with storage.transaction() as tx:
                tx.connection.execute("INSERT INTO t VALUES ('later')")
        except BaseException as exc:  # raised again by the test's thread
            failures.append(exc)
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(30)
    if failures:
        raise failures[0]
    return took[0]


def test_an_interrupt_as_begin_returns_leaves_neither_lock_held(tmp_path: Path) -> None:
    """A ``KeyboardInterrupt`` that lands after the queue's lock was taken, before the
    block is entered (here: as ``BEGIN IMMEDIATE`` returns from SQLite's busy wait), must
    not keep the lock (nor SQLite's): every later write of the process waited
    ``busy_timeout`` in the queue, then as long on SQLite's lock, and failed."""
    url = _file(tmp_path) + "?busy_timeout=2000"
    storage = SqliteStorage(url)
    blocker = sqlite3.connect(storage.path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another connection (as another process) writes

    def interrupt_then_commit() -> None:
        time.sleep(0.3)  # the main thread waits in SQLite's busy handler
        _thread.interrupt_main()
        time.sleep(0.1)
        blocker.execute("COMMIT")

    # Python's own SIGINT handler (a worker run earlier in this process installs its own
    # and leaves it: Worker.run).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=interrupt_then_commit)
    interrupter.start()
    entered = []
    try:
        with pytest.raises(KeyboardInterrupt), storage.transaction():
            entered.append(True)
        interrupter.join(10)
        assert entered == []  # raised in ``_begin``: no ``__exit__`` released anything
        assert _write_seconds(storage) < 1.0
    finally:
        interrupter.join(10)
        signal.signal(signal.SIGINT, previous)
        blocker.close()
        storage.close()


def test_close_while_a_thread_writes_frees_the_lock_for_the_files_other_storages(
    tmp_path: Path,
) -> None:
    """``close()`` resets the threads' locals: the transaction it cut short still
    releases the lock it took, which another ``App`` of the file shares."""
    url = _file(tmp_path) + "?busy_timeout=2000"
    closing, other = SqliteStorage(url), SqliteStorage(url)
    inside, closed = threading.Event(), threading.Event()

    def write_across_the_close() -> None:
        # (the commit on the closed connection fails; ``_fault`` meets it closed too)
        with contextlib.suppress(StorageError, sqlite3.Error), closing.transaction() as tx:
            tx.connection.execute("INSERT INTO t VALUES ('cut short')")
            inside.set()
            closed.wait(10)

    writer = threading.Thread(target=write_across_the_close)
    writer.start()
    try:
        assert inside.wait(10)
        closing.close()
        closed.set()
        writer.join(10)
        assert _write_seconds(other) < 1.0
    finally:
        closed.set()
        writer.join(10)
        other.close()
