"""A process forked with SQLite connections open: what its child may do with them.

SQLite keeps the state of its file locks in the process (one record per file, shared by
every connection of the process to it), and a forked child gets a copy of that record
without the locks themselves: POSIX locks belong to the process that took them. So, in
the child, measured with real processes (``tests/integration/test_sqlite_fork.py``):

* a connection the child *inherited* must never be used: it believes it holds the
  parent's locks, and a commit through it writes the WAL where the parent writes too;
* a *new* connection opened beside one still open from the parent takes no lock of its
  own on the file: the copied record says a connection of this process holds them. The
  parent's locks hide that for as long as the parent keeps the file open; once it closes
  it, its close finds no other process on the file, checkpoints and deletes the WAL, and
  the child's later commits go to the deleted WAL: lost to every other process. Had the
  parent's thread held the write lock at the fork, every write of the child waits for a
  lock no thread of the child holds (``database is locked``);
* closing an inherited connection is safe when nothing was using it at the fork (no
  transaction open, no thread inside a SQLite call with it): SQLite then forgets the
  copied record, and the child's new connections take real locks. Closing one that was
  in use rolls back the parent's transaction in the shared WAL index, or waits forever
  for a mutex held by a thread the child does not have.

So replayq's connections say whether they are in use (``Connection.inside``, counted by
the thread that uses them from before its first statement to the block's end), and a
child's first use of a file closes the connections it inherited to it when none was in
use, then opens its own (``leave_inherited``); when one was in use it refuses every use
of the file with a ``StorageError`` that says why and what to do, rather than wait on a
lock or lose commits. The connections it cannot close are kept, never used, for the
child's lifetime. The handler at fork (``SqliteStorage``'s) only moves connections
aside: a child that never uses SQLite touches none.

Connections this module cannot see — the caller's own to the same file (transactional
enqueue), another library's — have the same effect and are not checked: close them
before forking. ``:memory:`` and ``file:`` URI storages are not checked either (their
inherited connections are kept, never used or closed).
"""

from __future__ import annotations

import os
import sqlite3
import threading

from replayq.errors import StorageError

# ``Connection.inside`` of a connection the child inherited: nothing was using it at the
# fork / something was. Both below zero: a block that began before the fork (the forking
# thread's own) finds it so at its end and neither commits nor rolls back.
FORKED_IDLE = -2
FORKED_BUSY = -3
# ``Connection.inside`` of a connection ``SqliteStorage.close()`` closed, or left to the
# thread inside a block on it to close as that block ends.
CLOSED = -1
# ``Connection.inside`` of a connection ``close()`` left to its thread, once that thread
# has closed it (``CLOSED`` until then): no longer open, nothing for a child to inherit.
SHUT = -4

# Connections this process inherited and has not closed, by file (``_writer_key``).
_INHERITED: dict[str | None, list[Connection]] = {}
# Files whose inherited connections were in use at a fork, and why their use is refused.
_REFUSED: dict[str, str] = {}
# Held while a thread of the child closes a file's inherited connections: another thread
# must not open one of its own to the file before they are all closed.
_LEAVING = threading.Lock()


def _after_fork_in_child() -> None:
    """A new lock: a thread of the parent may have held it, and the child has no such thread."""
    global _LEAVING
    _LEAVING = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Connection(sqlite3.Connection):
    """A ``sqlite3.Connection`` that counts the blocks using it (``inside``), so that a
    forked child knows which of the connections it inherited it may close, and
    ``SqliteStorage.close()`` which ones it may close now: the count changes, and is read
    there, under ``guard``."""

    __slots__ = ("guard", "inside")

    guard: threading.Lock
    inside: int


def connect(target: str, *, uri: bool = False, timeout: float = 5.0) -> Connection:
    """A ``Connection`` that nothing uses yet, in autocommit mode (replayq says ``BEGIN``
    itself), usable from any thread (each is used by one at a time)."""
    conn = sqlite3.connect(
        target,
        timeout=timeout,
        isolation_level=None,
        check_same_thread=False,
        factory=Connection,
        uri=uri,
    )
    conn.inside = 0
    conn.guard = threading.Lock()
    return conn


def inherit(key: str | None, connections: list[Connection]) -> None:
    """At fork, in the child: ``connections`` (to the file named ``key``) are the parent's.

    Only Python attributes are written here: no SQLite call, so a mutex a thread of the
    parent held at the fork cannot stop the child.
    """
    if not connections:
        return
    for conn in connections:
        # ``CLOSED``: ``close()`` was closing it on another thread, which may be inside
        # SQLite's close still, or left it to the thread inside a block on it: in use too.
        busy = conn.inside != 0 or _in_transaction(conn)
        conn.inside = FORKED_BUSY if busy else FORKED_IDLE
        # A new lock: ``close()`` on a thread of the parent may have held it at the fork,
        # and the forking thread's block, ending here, takes it (``_leave``).
        conn.guard = threading.Lock()
    _INHERITED.setdefault(key, []).extend(connections)


def _in_transaction(conn: Connection) -> bool:
    """Whether a transaction is open (SQLite's autocommit flag: read without a mutex)."""
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:  # closed in the parent as it forked
        return False


def leave_inherited(key: str | None, path: str) -> None:
    """Before this process opens a connection to the file named ``key``: close the ones it
    inherited by fork, or refuse with ``StorageError`` if one was in use at the fork."""
    if key is None or not (_INHERITED or _REFUSED):
        return  # not forked with a connection open: the common case
    with _LEAVING:
        refused = _REFUSED.get(key)
        if refused is not None:
            raise StorageError(refused)
        inherited = _INHERITED.get(key)
        if not inherited:
            return
        if any(conn.inside == FORKED_BUSY for conn in inherited):
            refused = _REFUSED[key] = (
                f"cannot use {path!r} in this process: it was forked while a thread of its "
                "parent was using that file (inside a transaction, or another block of its "
                "storage). SQLite's locks do not carry across fork: the parent's connection "
                "can be neither used nor closed here, and a connection opened here beside "
                "it would take no lock of its own (its commits can be lost) or wait for a "
                "lock no thread here holds. Fork while no thread uses the file (close the "
                "App first: it opens again on its next use, in each process), or start the "
                "process with the 'spawn' or 'forkserver' method"
            )
            raise StorageError(refused)
        for conn in inherited:
            conn.close()
        del _INHERITED[key]
