"""The SQLite wake-up: an idle worker hears of a new job within milliseconds.

SQLite has no ``NOTIFY``. A ``Watcher`` thread keeps its own connection and asks
``PRAGMA data_version`` (a read of the WAL index header, no query of any table),
which changes whenever another connection commits to the file. It asks:

* at once when a write transaction of the same ``SqliteStorage`` in this process
  that may have made a job ready commits (``poke``: an insert, a transition, the ack
  of a job with an ordering key): an enqueuer and a worker in one process wake each
  other without waiting. A commit of a traced step's events and state writes does
  not poke, nor a lease, nor the acks of jobs without an ordering key: none can make
  a job ready, and each poke costs a wake-up and a ``PRAGMA`` here (a third of a
  traced job's CPU when every step's commit poked, and a few per cent of a no-op
  drain's when each group commit did, docs/benchmarks.md);
* else every ``interval`` seconds (5 ms by default): another process's commit is
  heard within that.

Measured (docs/benchmarks.md): the 5 ms check costs an idle worker about 2 % of a
core; a file watch (inotify on the WAL) would cost nothing while idle but is
Linux-only and loses its watch when the WAL is removed, and a socket needs every
enqueuing process to know the workers. A change the worker did not need (a
heartbeat, another process's ack) costs one indexed lease query, or nothing while
the worker holds every slot it has (it would lease none).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from urllib.parse import quote

from replayq.seal import unsealed
from replayq.storage.sqlite.fork import Connection, connect

log = logging.getLogger("replayq.storage.sqlite")

WATCH_SECONDS = 0.005


class Watcher:
    """A thread calling ``callback(None)`` when the file changed; ``close()`` to stop."""

    def __init__(
        self,
        path: str,
        callback: Callable[[str | None], None],
        *,
        interval: float = WATCH_SECONDS,
        on_close: Callable[[Watcher], None] | None = None,
    ) -> None:
        self.path = path
        self.callback = callback
        self.interval = interval
        self.listening = threading.Event()
        # The thread's connection while it has one: a forked child closes it before its
        # own first connection to the file, if it was not in use at the fork (fork.py).
        self.connection: Connection | None = None
        self._on_close = on_close
        self._poked = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replayq-watch", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """A write of this process committed: check now rather than at the next tick."""
        self._poked.set()

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._poked.set()
        if self._on_close is not None:
            self._on_close(self)
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except sqlite3.Error as exc:
                # The file is unavailable (moved, full disk, I/O error): the worker's own
                # poll still runs; look again shortly.
                log.warning("SQLite change watch failed (%s); retrying", exc)
            self.listening.clear()
            self._stop.wait(0.5)

    def _watch(self) -> None:
        # Read-only: the watch never creates the file (it would not be 0600) nor writes.
        target, uri = self.path, False
        if self.path != ":memory:":
            target, uri = f"file:{quote(self.path)}?mode=ro", True
        with unsealed():  # replayq's own database, also during a sealed replay
            conn = connect(target, uri=uri)
        conn.inside = 1  # in use around each statement (fork.py)
        self.connection = conn
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            conn.inside = 0
            self.listening.set()
            self.callback(None)  # anything enqueued before the watch began
            while not self._stop.is_set():
                self._poked.wait(self.interval)
                self._poked.clear()
                if self._stop.is_set():
                    return
                conn.inside = 1
                seen = conn.execute("PRAGMA data_version").fetchone()[0]
                conn.inside = 0
                if seen != version:
                    version = seen
                    self.callback(None)
        finally:
            conn.inside = 1
            self.connection = None
            conn.close()
