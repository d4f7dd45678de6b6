"""A process's threads that write one SQLite file queue on a lock of the process's
(``storage/sqlite``, ``_WRITERS``) instead of meeting on SQLite's lock, where the one
refused sleeps in SQLite's busy handler (1 ms, 2, 5, 10 ...) however soon it is free.

Real files, real threads. The waiting thread's own connection is told not to wait at all
(``PRAGMA busy_timeout = 0``): had it reached SQLite's lock while the other thread held
it, its ``BEGIN IMMEDIATE`` would fail at once (``database is locked``). That it goes
through, after the other's commit, shows it waited in the queue.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from replayq.errors import DatabaseUnavailableError
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
