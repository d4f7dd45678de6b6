"""A process forked with a SQLite storage open (gunicorn's preload, ``multiprocessing``'s
fork start method): what its child can do with it, and that the parent goes on.

Real files, real forked processes (``os.fork``; a child reports over a pipe and leaves
with ``os._exit``). What each test holds (``storage/sqlite/fork.py``):

* a child of a parent that was not using the file at the fork uses the storage it
  inherited as its own, and its commits outlive the parent's close: its connections
  take locks of their own (beside a connection inherited from the parent they took none,
  and the parent's close deleted the WAL under the child's later commits);
* a child forked while a thread of the parent used the file (the write lock held, a
  read transaction open, or a block between two statements) is refused at once with a
  ``StorageError`` that says why, on the storage it inherited and on one it opens
  itself, instead of ``database is locked`` after each ``busy_timeout`` (or, with no
  lock held, commits that can be lost); the parent's transaction commits;
* a transaction the forking thread had open is neither committed nor rolled back by
  the child.
"""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import replayq
from replayq.errors import StorageError
from replayq.storage.sqlite import SqliteStorage

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD_SECONDS = 30  # a child that has not reported by then hangs: killed, and the test fails


def _report(work: Callable[[], str]) -> str:
    """What ``work`` returned, or ``raised <type>: <message>``."""
    try:
        return work()
    except BaseException as exc:  # reported to the parent, which judges it
        return f"raised {type(exc).__name__}: {exc}"


def _receive(fd: int, pid: int) -> str:
    """The child's next report on ``fd``; a child silent for ``CHILD_SECONDS`` is killed."""
    ready, _, _ = select.select([fd], [], [], CHILD_SECONDS)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the child was silent for {CHILD_SECONDS} s (hung)")
    return os.read(fd, 65536).decode()


def _in_child(work: Callable[[], str]) -> str:
    """Run ``work`` in a forked child; what it reported (``_report``)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave, whatever happens
        try:
            os.close(read)
            os.write(write, _report(work).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        return _receive(read, pid)
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def _file(tmp_path: Path) -> str:
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (who TEXT)")
    conn.close()
    return f"sqlite:///{path}?busy_timeout=2000"


def _rows(url: str) -> list[str]:
    """The table's rows, read by a connection of this test's own."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0])
    try:
        return [who for (who,) in conn.execute("SELECT who FROM t ORDER BY rowid")]
    finally:
        conn.close()


def _write(storage: SqliteStorage, who: str) -> None:
    with storage.transaction() as tx:
        tx.connection.execute("INSERT INTO t VALUES (?)", (who,))


@pytest.mark.parametrize("listening", [False, True], ids=["", "listening"])
def test_a_child_of_an_idle_app_enqueues_through_it_and_its_jobs_outlive_the_parents_close(
    tmp_path: Path, listening: bool
) -> None:
    """The child's second enqueue commits after the parent closed its last connection to
    the file: had the child's connections taken no locks of their own, that close found
    no other process on the file, deleted the WAL, and the job was lost. ``listening``:
    the parent's storage has a watcher too (a worker's wake-ups), whose own connection
    the child must close as well."""
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}")

    @app.job("count")
    def count(ctx: replayq.Context, n: int) -> None:
        """Never run here."""

    app.enqueue("count", {"n": 0})  # the parent's storage, open and used, idle at the fork
    if listening:
        watcher = app.runtime.storage.listen(lambda queue: None)  # type: ignore[attr-defined]
        assert watcher.listening.wait(10)
        # Between two looks at the file at the fork, not inside one (a look then is a
        # use: the child would be refused): the next look is an hour away.
        watcher.interval = 3600
        time.sleep(0.05)
    to_child_read, to_child = os.pipe()
    from_child, from_child_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:

            def enqueue_across_the_parents_close() -> str:
                app.enqueue("count", {"n": 1})
                os.write(from_child_write, b"1")
                os.read(to_child_read, 1)  # the parent has closed its app
                app.enqueue("count", {"n": 2})
                return "enqueued"

            os.write(from_child_write, _report(enqueue_across_the_parents_close).encode())
        finally:
            os._exit(0)
    try:
        assert _receive(from_child, pid) == "1"
        if listening:
            watcher.close()
        app.close()  # the parent's connections: the last ones to the file but the child's
        os.write(to_child, b"1")
        assert _receive(from_child, pid) == "enqueued"
    finally:
        os.waitpid(pid, 0)
        for fd in (to_child_read, to_child, from_child, from_child_write):
            os.close(fd)
    app.enqueue("count", {"n": 3})  # the parent goes on (the app opens again)
    jobs = app.list_jobs()
    app.close()
    assert sorted(job.payload["n"] for job in jobs) == [0, 1, 2, 3]


Held = tuple[str, SqliteStorage, Callable[[], None]]


@pytest.fixture
def held(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Held]:
    """A storage one of whose threads is inside a block (by ``request.param``: a write
    transaction with its row, a read transaction, or an ``autocommit`` block between its
    statements, which holds the process's writer queue and no SQLite lock): the URL, the
    storage, and what ends that block."""
    url = _file(tmp_path)
    storage = SqliteStorage(url)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        if request.param == "autocommit":
            block = storage.autocommit()
        else:
            block = storage.transaction(readonly=request.param == "read")
        with block as tx:
            if request.param == "write":
                tx.connection.execute("INSERT INTO t VALUES ('held at the fork')")
            elif request.param == "read":
                tx.connection.execute("SELECT count(*) FROM t").fetchone()
            holding.set()
            release.wait(CHILD_SECONDS)

    def end() -> None:
        release.set()
        holder.join(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        yield url, storage, end
    finally:
        end()
        storage.close()


@pytest.mark.parametrize("held", ["write", "read", "autocommit"], indirect=True)
def test_a_child_forked_while_a_thread_used_the_file_is_refused_at_once_and_the_parent_goes_on(
    held: Held, request: pytest.FixtureRequest
) -> None:
    url, storage, end = held

    def write(open_storage: Callable[[], SqliteStorage]) -> str:
        _write(open_storage(), "child")
        return "wrote"

    def write_twice() -> str:
        said = []
        for opened in (lambda: storage, lambda: SqliteStorage(url)):  # inherited, then new
            start = time.monotonic()
            said.append(_report(lambda: write(opened)))  # noqa: B023 (called at once)
            said.append(f"{time.monotonic() - start:.3f}")
        return "\n".join(said)

    inherited, inherited_took, new, new_took = _in_child(write_twice).split("\n")
    for said, took in ((inherited, inherited_took), (new, new_took)):
        assert said.startswith("raised StorageError: "), said
        assert "forked while a thread of its parent was using that file" in said
        assert "close the App first" in said and "'spawn'" in said
        # Refused, not waited out: busy_timeout is 2 s, in the writer queue (whose lock the
        # parent's thread held at the fork) and then on SQLite's lock.
        assert float(took) < 1.0
    end()  # the parent's transaction commits
    _write(storage, "parent")  # and the parent goes on
    before = ["held at the fork"] if request.node.callspec.params["held"] == "write" else []
    assert _rows(url) == [*before, "parent"]


def test_a_transaction_open_in_the_forking_thread_ends_in_the_parent_alone(
    tmp_path: Path,
) -> None:
    """The child leaves the block it inherited without committing it (nor rolling it
    back: the parent's connection is not the child's); the parent commits it, once."""
    url = _file(tmp_path)
    storage = SqliteStorage(url)
    read, write = os.pipe()
    pid = -1
    outcome = "left the block without an error"
    try:
        with storage.transaction() as tx:
            tx.connection.execute("INSERT INTO t VALUES ('in the block')")
            pid = os.fork()
    except BaseException as exc:
        if pid != 0:
            raise
        outcome = f"raised {type(exc).__name__}: {exc}"
    if pid == 0:  # the child: report and leave
        try:
            os.write(write, outcome.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        said = _receive(read, pid)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert said.startswith("raised StorageError: "), said
    assert "forked inside a transaction" in said
    assert _rows(url) == ["in the block"]
    conn = sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0])
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    storage.close()


@pytest.mark.parametrize("kind", ["write", "read"])
def test_a_child_forked_after_close_while_a_thread_was_still_in_a_block_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """``close()`` leaves a connection a thread is inside a block on to that thread (it
    is closed as the block ends): until then it is open, with whatever lock the block
    holds. A child forked meanwhile ("close the App first", as the refusal advises) must
    be refused as for any block open at the fork, not open its own connection beside
    that one, unseen: beside the parent's write lock each of its writes waited out
    ``busy_timeout`` and failed with ``database is locked``, and beside a read its
    commits could be lost once the parent's connection closed."""
    url = _file(tmp_path)
    storage = SqliteStorage(url)
    holding, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def hold() -> None:
        try:
            with storage.transaction(readonly=kind == "read") as tx:
                if kind == "write":
                    tx.connection.execute("INSERT INTO t VALUES ('held at the close')")
                else:
                    tx.connection.execute("SELECT count(*) FROM t").fetchone()
                holding.set()
                release.wait(CHILD_SECONDS)
        except StorageError as exc:
            ended.append(str(exc))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        storage.close()

        def write() -> str:
            start = time.monotonic()
            said = _report(lambda: (_write(SqliteStorage(url), "child"), "wrote")[1])
            return f"{said}\n{time.monotonic() - start:.3f}"

        said, took = _in_child(write).split("\n")
    finally:
        release.set()
        holder.join(10)
    assert said.startswith("raised StorageError: "), said
    assert "forked while a thread of its parent was using that file" in said
    assert float(took) < 1.0  # refused, not waited out (busy_timeout is 2 s)
    assert len(ended) == 1 and "storage is closed" in ended[0], ended  # nothing committed
    assert _rows(url) == []
    # Once the block has ended (its thread closed the connection), a child forked from
    # the closed storage's process uses the file.
    assert _in_child(lambda: (_write(SqliteStorage(url), "child"), "wrote")[1]) == "wrote"
    fresh = SqliteStorage(url)  # and the parent goes on with it
    _write(fresh, "parent")
    fresh.close()
    assert _rows(url) == ["child", "parent"]


def test_a_child_forked_while_close_held_a_connections_guard_ends_its_block(
    tmp_path: Path,
) -> None:
    """``close()`` on another thread holds a connection's ``guard`` for a moment as it marks
    it (and its own thread does, counting a block in or out). A child forked in that moment
    inherits the lock held, by a thread it does not have: the forking thread's block, ending
    in the child, waited for it forever. The moment is a few bytecodes wide, too narrow to
    meet by chance in a test: a thread holds the guard across the fork here, as ``close()``
    would."""
    url = _file(tmp_path)
    storage = SqliteStorage(url)
    holding, release = threading.Event(), threading.Event()
    read, write = os.pipe()
    pid = -1
    outcome = "left the block without an error"
    try:
        with storage.transaction() as tx:
            tx.connection.execute("INSERT INTO t VALUES ('in the block')")
            guard = tx.connection.guard

            def hold() -> None:
                with guard:
                    holding.set()
                    release.wait(CHILD_SECONDS)

            holder = threading.Thread(target=hold)
            holder.start()
            assert holding.wait(10)
            pid = os.fork()
            if pid != 0:
                release.set()
                holder.join(10)
    except BaseException as exc:
        if pid != 0:
            raise
        outcome = f"raised {type(exc).__name__}: {exc}"
    if pid == 0:  # the child: report and leave
        try:
            os.write(write, outcome.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        said = _receive(read, pid)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert said.startswith("raised StorageError: "), said
    assert "forked inside a transaction" in said
    assert _rows(url) == ["in the block"]  # the parent committed it
    storage.close()
