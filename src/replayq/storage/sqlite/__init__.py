"""SQLite backend: the embedded default, one file in WAL mode.

Known limits, up front:

* One writer at a time. Every write transaction is ``BEGIN IMMEDIATE`` (an
  ``App.enqueue``, one statement committed by itself, takes the lock as that statement
  runs) and waits up to ``busy_timeout`` (5 s) for the write lock; past that the driver
  raises ``database is locked`` (``SQLITE_BUSY``), surfaced as
  ``DatabaseUnavailableError``: the worker waits it out like a server restart.
* A worker process frozen (SIGSTOP, a paused VM) *inside* a write transaction
  keeps the write lock until it resumes or dies: no server can end its session,
  so every other writer waits (and retries) meanwhile. Fencing still holds once it
  resumes; but on one host with that risk, PostgreSQL (which ends such sessions
  after ``idle_in_transaction_timeout``) is the backend to choose.
* Faults of the file rather than of a statement — busy or locked, disk full,
  read-only file system, I/O error, cannot open — are ``DatabaseUnavailableError``
  too (``_UNAVAILABLE_CODES``); nothing was written, and they clear by themselves
  or by an operator's hand, so retrying is right. A failed ``ROLLBACK`` after such
  a fault is ignored: the original error is the one reported.
* SQLite keeps the ``errno`` to itself: a write refused ``EROFS`` is ``disk I/O
  error`` (``SQLITE_IOERR_WRITE``), a read that fails ``EIO`` is ``database disk image
  is malformed`` (``SQLITE_IOERR_CORRUPTFS``, reported as ``SQLITE_CORRUPT``). So the
  message adds SQLite's extended code and, when the file cannot be written, says so;
  and ``SQLITE_CORRUPT`` is waited out too: a worker can do nothing else with a file
  it cannot read, and a real corruption is an operator's to repair either way.
* A connection opened while the file system is read-only is read-only for good
  (SQLite falls back to ``O_RDONLY``): after ``SQLITE_READONLY`` the connection is
  closed, and the next transaction opens a new one.
* Leases are judged by SQLite's own clock (``julianday('now')``: the host's, which
  every process on the file shares) when the worker's app runs on the real clock,
  not by each worker's reading of it; an injected test clock judges them itself.
* Database files are created ``0600`` (the WAL and shared-memory files inherit
  the mode): traces hold payloads and call arguments.
* Many worker *processes* on one host share the file safely; many *hosts* must
  not (network file systems break SQLite locking): use PostgreSQL for that.
* Transactional enqueue (``App.enqueue(conn=)``) needs replayq's schema in the file
  before the caller's transaction takes the write lock: replayq cannot create its
  tables while another connection writes. The first ``App`` use, or
  ``replayq --db URL db upgrade``, creates them; later opens take no write lock.
* Wake-ups: a worker's ``listen`` watches the file (``watch.py``): any commit,
  of a job or not, wakes its idle workers within 5 ms from another process; from
  the same ``App`` at once when the commit may have made a job ready (an enqueue,
  a retry, the ack of a job with an ordering key), else within the same 5 ms. An
  idle worker spends ~2 % of a core on it.
* Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL``. A committed
  transaction survives a crash of any process; on power loss or an OS crash
  the last transactions before the failure may roll back (the database stays
  consistent). ``App(url + "?synchronous=FULL")`` makes every commit durable
  against power loss at the cost of an fsync per commit.
* Trace packs are stored deflated (``rq_trace.events`` is a blob since migration
  0016; a new job's ``job.enqueued`` pack, its data's values since 0019, as a lease's
  ``job.leased`` and an ack's ``job.succeeded`` pack since 0021; that ``job.enqueued``
  pack kept in the job's row, ``rq_jobs.enqueued``, since 0023, read through the views
  ``rq_packs`` and ``rq_events``; ``storage/packs.py``): a plain ``sqlite3`` shell
  cannot read them, nor the ``rq_events`` view over them, because the view decodes
  them with ``rq_pack_json``, a function replayq registers on its own connections.
  The bytes a traced job stores fell by more than half; reading the trace in SQL
  outside replayq needs
  ``packs.register_sqlite(conn)`` first (docs/recording-context.md).
* Page size: a database replayq creates has 2048-byte pages (``?page_size=`` chooses
  another power of two when the file is created; an existing file keeps its own). A
  commit writes each page it dirtied to the WAL whole, and a queue's commits are small.
* Lock waits: a write waits up to 5 s for another writer's lock (``?busy_timeout=``
  in milliseconds changes it); past that the write raises
  ``DatabaseUnavailableError``, which workers wait out. Writers of one process (a
  worker's executors and its acks thread, two ``App`` objects of one file) queue on a
  lock of the process first (``_WRITERS``) and go the moment the one before commits;
  only writers of other processes meet on SQLite's lock, whose busy handler sleeps
  (1 ms, 2, 5, 10 ...) between its tries. A write that waited ``busy_timeout`` in the
  queue goes on to SQLite's lock and waits there too: up to twice ``busy_timeout``
  before the error.
* Fork (``fork.py``): SQLite's locks do not carry across ``fork()``, and a connection
  the child opens beside one it inherited takes none of its own (its commits can be
  lost once the parent closes the file). A child's first use of the file closes the
  connections it inherited, when nothing was using them at the fork, and opens its own:
  an ``App`` opened before the fork works in the child. When a thread of the parent was
  inside a block on the file at the fork, they can be neither used nor closed, and
  every use of the file in the child raises ``StorageError`` saying so (fork while no
  thread uses it, ``App.close()`` first, or use the ``spawn`` start method). Other
  connections to the file (the caller's own) are not seen: close them before forking.
* After ``close()`` every use of the storage raises ``StorageError`` (closed), as on
  PostgreSQL; a block another thread had open on it raises it too and commits nothing
  (unless its ``COMMIT`` had begun).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import re
import shutil
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from replayq.errors import (
    ConfigurationError,
    ConstraintViolationError,
    DatabaseUnavailableError,
    StorageError,
)
from replayq.seal import unsealed
from replayq.storage import migrate, packs
from replayq.storage.adopted import TupleRows
from replayq.storage.pack_dictionaries import PackDictionaries
from replayq.storage.params import TraceQuery
from replayq.storage.protocol import (
    JobInsert,
    JobsComplete,
    Listener,
    MigrationStatus,
    SnapshotRead,
    storage_closed,
)
from replayq.storage.queries import load_queries
from replayq.storage.sql_transaction import JOBS_COMPLETE_COLUMNS, SqlTransaction
from replayq.storage.sqlite import fork
from replayq.storage.sqlite.fork import Connection
from replayq.storage.sqlite.watch import Watcher

_MIGRATIONS = "replayq.storage.sqlite.migrations"
_SYNC_MODES = {"OFF", "NORMAL", "FULL", "EXTRA"}
# The page size of a database replayq creates (``?page_size=`` chooses another). Each
# commit writes every page it dirtied to the WAL whole: an enqueue dirties about six
# (the job row, with its ``job.enqueued`` pack since migration 0023, and four indexes),
# so half-size
# pages halve the bytes each commit copies, checksums and writes (docs/operations.md).
_PAGE_SIZE = 2048
_PAGE_SIZES = {512 << n for n in range(8)}  # 512 .. 65536, as SQLite allows
# The automatic checkpoint's size, whatever the page size: 4,000 pages of 4 KB, 8,000 of 2 KB.
_WAL_AUTOCHECKPOINT_BYTES = 4000 * 4096
_JOURNAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
# On a small or nearly full disk the WAL must never take the room a checkpoint needs:
# it is checkpointed once it holds a quarter of the free space (at least this many pages).
_WAL_MIN_PAGES = 64
# One lock a database file (by its resolved path) for the write transactions of this
# process's threads, whatever ``SqliteStorage`` they go through (``_writer_of``): a thread
# that finds another of the process writing waits on it, woken the moment that one
# commits. Without it both ask SQLite, and the one refused sleeps in SQLite's busy
# handler (1 ms, then 2, 5, 10 ...) however soon the lock is free again: a worker's
# executor (a step's commit) and its acks thread (a group commit) met so on most traced
# jobs. Other processes still meet on SQLite's own lock.
_WRITERS: dict[str, threading.Lock] = {}
_WRITERS_LOCK = threading.Lock()
# Every storage of the process, so that a forked child gives each a lock of its own.
_STORAGES: weakref.WeakSet[SqliteStorage] = weakref.WeakSet()


def _writer_key(path: str) -> str | None:
    """The name of ``path``'s lock in ``_WRITERS``; ``None`` for ``:memory:`` and ``file:``
    URIs, which have one each, their own."""
    if path == ":memory:" or path.startswith("file:"):
        return None
    return os.path.realpath(os.path.expanduser(path))


def _writer_of(key: str | None) -> threading.Lock:
    """The process's lock for writing the file named ``key`` (``_writer_key``)."""
    if key is None:
        return threading.Lock()
    with _WRITERS_LOCK:
        found = _WRITERS.get(key)
        if found is None:
            found = _WRITERS[key] = threading.Lock()
        return found


def _after_fork_in_child() -> None:
    """In a forked child, the storages it inherited give up their parent's connections.

    Each storage's connections (and its watchers') go to ``fork.inherit``, marked in use
    or not at the fork, and its threads open new ones on their next use, once
    ``fork.leave_inherited`` has closed the old ones or refused (``fork.py``). No SQLite
    call is made here. A child forked while a thread of its parent wrote also holds that
    thread's locks of the process and never the thread: new locks (``_writer``, and
    ``_all_lock``; a transaction the forking thread had open releases the one it took,
    ``_Transaction._held``).
    """
    global _WRITERS_LOCK
    _WRITERS_LOCK = threading.Lock()
    _WRITERS.clear()
    for storage in list(_STORAGES):
        storage._writer = _writer_of(storage._writer_key)
        storage._all_lock = threading.Lock()
        watched = [w.connection for w in storage._watchers if w.connection is not None]
        # Those ``close()`` left to a thread inside a block on them are open until it ends:
        # in use at the fork, and beside them a connection of the child's takes no lock.
        left = [conn for conn in storage._left if conn.inside != fork.SHUT]
        fork.inherit(storage._writer_key, storage._all + left + watched)
        storage._left = []
        storage._all = []
        storage._local = threading.local()


os.register_at_fork(after_in_child=_after_fork_in_child)

# How many write transactions of one connection between two looks at the free space.
_RETUNE_EVERY = 128
# A WAL this many times its automatic checkpoint's size has grown past checkpoints that
# could not restart it (readers kept using it): the committing writer waits for them.
_WAL_OVERGROWN = 2
# How long that commit waits for the WAL's readers. It holds the write lock meanwhile:
# other writers (their own ``busy_timeout`` is seconds) wait at most this long for it.
_WAL_RESTART_WAIT_MS = 200
# The wait is spent in tries of this long each. A try waits for the reader that holds
# the oldest read mark it saw; readers that begin meanwhile can take that mark's slot
# again (with a newer mark) and keep it locked, and only a new try sees the newer mark.
_WAL_RESTART_TRY_MS = 40
# How many rows a connection's commits change between two looks at the WAL's size: a
# ``stat`` of it after every commit was ~2 µs of each ~60 µs enqueue (two rows, the job
# and its pack) for a bound with a checkpoint's worth of slack. Every commit that changed
# this many rows or more since the last look (a bulk enqueue, a worker's batch) looks at
# once; one-job commits look every 16th. The WAL grows by ~16 enqueues' pages
# (~300 KB) at most past where it would have been seen.
_WAL_LOOK_EVERY_CHANGES = 32
# Primary result codes of a fault that passes (or is fixed outside replayq) rather than a
# bad statement: BUSY 5, LOCKED 6, NOMEM 7, READONLY 8, IOERR 10, CORRUPT 11 (what a read
# failing EIO becomes), FULL 13, CANTOPEN 14, PROTOCOL 15 (https://sqlite.org/rescode.html).
_UNAVAILABLE_CODES = frozenset({5, 6, 7, 8, 10, 11, 13, 14, 15})
_SQLITE_READONLY = 8
# ``sqlite_errorcode``'s primary code when a lock another connection holds refused a statement.
_SQLITE_BUSY = 5
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
# Codes after which it is worth asking whether the file can be written at all.
_WRITE_FAULT_CODES = frozenset({_SQLITE_READONLY, 10, 14})
_DB_FILE_MODE = 0o600

log = logging.getLogger("replayq.storage.sqlite")


def storage_error(what: str, exc: sqlite3.Error, path: str | None = None) -> StorageError:
    """The replayq error for a driver error: a passing fault of the file vs. anything else.

    A fault of the file names SQLite's extended code and, given the file's ``path``,
    whether the file can be written at all (SQLite's own message hides the ``errno``).
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.IntegrityError) or (code is not None and code & 0xFF == 19):
        # SQLITE_CONSTRAINT: a unique key, a foreign key, a check, a not-null column. Its
        # message names the constraint, never the row's values; refused again if retried.
        name = getattr(exc, "sqlite_errorname", None)
        table, constraint = constraint_named(str(exc))
        return ConstraintViolationError(
            f"{what}: {exc}" + (f" ({name})" if name else ""),
            table=table,
            constraint=constraint,
        )
    if code is None or code & 0xFF not in _UNAVAILABLE_CODES:
        return StorageError(f"{what}: {exc}")
    detail = f"{exc} ({getattr(exc, 'sqlite_errorname', code)})"
    if code & 0xFF == _SQLITE_CORRUPT:
        detail += "; SQLite says so of a read that failed with an I/O error (EIO) too"
    elif code & 0xFF in _WRITE_FAULT_CODES and path is not None:
        detail += _unwritable(path)
    return DatabaseUnavailableError(f"{what}: {detail}")


# SQLite's message for a constraint's refusal: ``UNIQUE constraint failed: t.a, t.b``,
# ``NOT NULL constraint failed: t.a``, ``UNIQUE constraint failed: index 'name'`` (an index
# on expressions), ``CHECK constraint failed: <its name, or its expression>``,
# ``FOREIGN KEY constraint failed`` (nothing named). A trigger's ``RAISE`` says its own text.
_CONSTRAINT_FAILED = re.compile(
    r"(UNIQUE|PRIMARY KEY|NOT NULL|CHECK) constraint failed: (.+)\Z", re.DOTALL
)
_INDEX_NAMED = re.compile(r"index '([^']+)'\Z")
_COLUMN_NAMED = re.compile(r"([^\s.,]+)\.")


def constraint_named(message: str) -> tuple[str | None, str | None]:
    """The table and the constraint a refusal's ``message`` names, as far as it does
    (``ConstraintViolationError.table``, ``.constraint``): a unique key's or a not-null
    column's table is before its first column's dot; a ``CHECK``'s message gives its name,
    or its expression when it has none, and an index on expressions its name: their table
    is looked up among replayq's own (``_own_schema``), and an application's names none."""
    found = _CONSTRAINT_FAILED.match(message)
    if found is None:
        return None, None
    kind, named = found.group(1), found.group(2).strip()
    checks, indexes = _own_schema()
    if kind == "CHECK":
        wanted = " ".join(named.split())
        for table, statement in checks:
            if f"CHECK ({wanted})" in statement or f"CONSTRAINT {wanted} CHECK" in statement:
                return table, named
        return None, named
    index = _INDEX_NAMED.match(named)
    if index is not None:
        return indexes.get(index.group(1)), index.group(1)
    column = _COLUMN_NAMED.match(named)
    return (column.group(1) if column else None), named


_OWN_TABLE = re.compile(r'CREATE TABLE (?:IF NOT EXISTS )?"?(\w+)"?')
_OWN_INDEX = re.compile(r'CREATE (?:UNIQUE )?INDEX (?:IF NOT EXISTS )?"?(\w+)"? ON "?(\w+)"?')


@functools.cache
def _own_schema() -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """replayq's own schema (``schema.sql``, what the migrations make): each table and its
    ``CREATE TABLE`` statement, its white space made single spaces (a ``CHECK``'s
    expression is found in it as SQLite quotes it); each index's table, by its name. Read
    on the first refusal a process meets that needs it, never before (nor is
    ``importlib.resources``, which a running worker otherwise never loads)."""
    from importlib import resources

    text = resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")
    tables, indexes = [], {}
    for statement in text.split(";\n"):
        table = _OWN_TABLE.search(statement)
        if table is not None:
            tables.append((table.group(1), " ".join(statement.split())))
        for index in _OWN_INDEX.finditer(statement):
            indexes[index.group(1)] = index.group(2)
    return tuple(tables), indexes


def _unwritable(path: str) -> str:
    """``"; ..."`` saying why ``path`` cannot be written, or ``""`` if it can.

    ``access`` opens no file: opening and closing the database file here would drop
    this process's SQLite locks on it (POSIX locks belong to the process, not the fd).
    """
    if path == ":memory:" or path.startswith("file:"):
        return ""
    try:
        if os.access(path, os.W_OK):
            return ""
        read_only = bool(os.statvfs(os.path.dirname(path) or ".").f_flag & os.ST_RDONLY)
    except OSError:
        return ""
    if read_only:
        return "; its file system is read-only"
    return "; the file cannot be written (a read-only file system, or its permissions)"


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is open; a failure here never hides the error that led here.

    After ``SQLITE_FULL`` or ``SQLITE_IOERR`` SQLite may have rolled back already, and
    ``ROLLBACK`` then fails with ``cannot rollback - no transaction is active``.
    """
    try:
        if not conn.in_transaction:
            return
    except sqlite3.ProgrammingError:  # closed (``SqliteStorage.close()``): nothing to end
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.debug("ROLLBACK failed after an earlier error: %s", exc)


def _enter(conn: Connection) -> int:
    """One block more in ``conn`` (``inside``) unless it is marked closed or inherited by
    a fork (below zero, kept): the count before. From here to ``_leave`` no other thread
    closes it. ``close()`` on one thread while another's statement runs on the
    connection crashed the process (Python 3.11's sqlite3 frees it under the statement):
    ``close()`` now closes only connections nothing is inside, and leaves the others to
    their thread's ``_leave``."""
    with conn.guard:
        inside = conn.inside
        if inside >= 0:
            conn.inside = inside + 1
    return inside


def _leave(conn: Connection) -> None:
    """One block fewer in ``conn`` (``inside``); a connection ``close()`` marked while a
    block was in it is closed here, on the thread that used it, and marked ``SHUT`` (an
    outer block of the thread then does nothing; a fork's mark is kept)."""
    with conn.guard:
        inside = conn.inside
        if inside > 0:
            conn.inside = inside - 1
            return
    if inside == fork.CLOSED:
        conn.close()
        conn.inside = fork.SHUT  # closed: a child forked from now on inherits nothing of it


@contextlib.contextmanager
def _using(conn: Connection, path: str) -> Iterator[Connection]:
    """``conn`` counted in use (``inside``) for a block outside ``transaction()``
    (migrations, a connection's settings): a child forked meanwhile must not close it
    (``fork.py``), nor ``close()`` on another thread."""
    if _enter(conn) < 0:
        raise storage_closed(f"SQLite database {path!r}")
    try:
        yield conn
    finally:
        _leave(conn)


def _busy(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, SQLite's ``SQLITE_BUSY`` (a lock held)."""
    current: BaseException | None = exc
    for _ in range(4):
        if current is None:
            return False
        if (getattr(current, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_BUSY:
            return True
        current = current.__cause__
    return False


def _is_full(exc: sqlite3.Error) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL


def _after_fault(conn: sqlite3.Connection, exc: sqlite3.Error) -> None:
    """Roll back; after ``SQLITE_FULL`` also checkpoint the WAL, so the next write can fit.

    The WAL only restarts from its beginning after a checkpoint, and the automatic one
    runs after a successful commit: on a full disk none succeeds, so without this the
    WAL can never reuse its own pages, even once space is freed elsewhere.
    ``TRUNCATE`` also gives the file's space back to the file system.
    """
    _rollback(conn)
    if _is_full(exc):
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as checkpoint_exc:
            log.debug("checkpoint after a full disk failed: %s", checkpoint_exc)


def create_private(path: str) -> None:
    """Create the database file ``0600`` if it does not exist yet (SQLite would use 0644)."""
    if path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        return
    with contextlib.suppress(FileExistsError):  # another process created it first
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _DB_FILE_MODE))


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///rel.db``, ``sqlite:////abs.db`` or a bare path → (path, options)."""
    if not url.startswith("sqlite:"):
        return url, {}
    parts = urlsplit(url)
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigurationError(f"{url!r}: no database file; use sqlite:///path/to/file.db")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return path, options


def split_statements(script: str) -> list[str]:
    """Split a SQL script into complete statements (triggers included) without executing it."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buffer.splitlines()
    ):
        raise StorageError(f"incomplete SQL statement at the end of a migration: {buffer[:80]!r}")
    return statements


def run_migration(conn: sqlite3.Connection, script: str, replayq: migrate.ReplayqNames) -> None:
    """Run one migration's ``script`` and keep the owner's indexes and triggers it dropped.

    A migration that drops a table to copy it (0011, 0017, 0018, 0022, 0025, 0026), or a table
    or view to put a view in its place (0009, 0016, 0023), drops every index and trigger
    on it with it. Those replayq made (``replayq.objects``), the migration makes again.

    SQLite's procedure for a change ALTER TABLE cannot make (lang_altertable.html, section
    7) saves the indexes, triggers and views that depend on the table it copies and makes
    them again. Views need nothing here: a migration renames its copy in legacy mode,
    and a view names the table, which the copy is again. An index or trigger of the
    owner's (one ``replayq.objects`` does not name) on a table or view the script drops is
    made again from its own SQL once the script is done, so it fires for the rows written
    after the upgrade and not for the copy. One that cannot be (its table is a view now)
    refuses the upgrade, naming it: never dropped without a word. So does a column the
    owner added to a table the script drops (one no word of replayq's SQL names) that the
    table or view in its place has not: the copy takes the columns it knows.
    """
    register_migration_functions(conn)
    dropped = migrate.dropped_relations(script)
    owned: list[tuple[str, str, str, str]] = []
    columns: dict[str, list[str]] = {}
    if dropped:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
            " WHERE type IN ('index', 'trigger', 'table') AND sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
        owned = [
            (kind, name, table, sql)
            for kind, name, table, sql in rows
            if kind != "table" and table.lower() in dropped and not replayq.made(kind, name)
        ]
        columns = {
            name: _columns(conn, name)
            for kind, name, _, _ in rows
            if kind == "table" and name.lower() in dropped
        }
    try:
        for statement in split_statements(script):
            conn.execute(statement)
    finally:
        # The script switches it off after its rename; after a failure it may not have.
        conn.execute("PRAGMA legacy_alter_table = OFF")
    for table, before in columns.items():
        after = {column.lower() for column in _columns(conn, table)}
        for column in before:
            if not replayq.made("column", column) and column.lower() not in after:
                raise migrate.owner_column_refused(column, table)
    for kind, name, table, sql in owned:
        present = "SELECT 1 FROM sqlite_master WHERE name = ? COLLATE NOCASE"
        if conn.execute(present, (name,)).fetchone():
            continue  # the script did not drop it after all
        try:
            conn.execute(sql)
        except sqlite3.Error as exc:
            why = (
                f"this upgrade drops {table!r} (to copy it, or to put a view in its place) "
                f"and cannot make the {kind} again after it ({exc})"
            )
            drop = f"DROP {kind.upper()} {name}"
            what = f"{kind} {name!r} on {table!r}"
            raise migrate.owner_object_refused(what, why, drop) from exc


def _unhex(value: Any) -> Any:
    """The bytes a hex text stands for (SQLite 3.41's ``unhex``); another value as it is."""
    return bytes.fromhex(value) if isinstance(value, str) else value


def register_migration_functions(conn: sqlite3.Connection) -> None:
    """Give ``conn`` the functions replayq's migrations call beside SQLite's own:
    ``rq_unhex`` (0026 stores the blob store's keys as bytes; SQLite 3.40 has no ``unhex``).
    ``run_migration`` does it; a test applying migrations by hand calls it first."""
    conn.create_function("rq_unhex", 1, _unhex, deterministic=True)


def _columns(conn: sqlite3.Connection, relation: str) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (relation,))]


_PARAMETER = re.compile(r":(\w+)")
# The text of a statement with some of its named parameters written as ``NULL``, by the
# statement and those names (``SqliteTransaction.inserted_id``). Bounded; a statement and a
# set of names always give the same text, so clearing it only costs a rebuild.
_NULL_FOLDED: dict[tuple[str, tuple[str, ...]], str] = {}
_NULL_FOLDED_MAX = 256


def null_folded(sql: str, nulls: tuple[str, ...]) -> str:
    """``sql`` with each named parameter in ``nulls`` (``:name``) written ``NULL``."""
    key = (sql, nulls)
    folded = _NULL_FOLDED.get(key)
    if folded is None:
        names = set(nulls)
        folded = _PARAMETER.sub(lambda m: "NULL" if m.group(1) in names else m.group(0), sql)
        if len(_NULL_FOLDED) >= _NULL_FOLDED_MAX:
            _NULL_FOLDED.clear()
        _NULL_FOLDED[key] = folded
    return folded


# ``null_folded``'s text with its other parameters written ``?``, and what reads their
# values from a mapping in that order, by the statement and its ``None`` names; ``None``
# where the text may hold ``:name`` that is not a parameter. Bounded.
_Positional = tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]]
_POSITIONAL: dict[tuple[str, tuple[str, ...]], _Positional | None] = {}
_LITERAL = re.compile(r"'[^']*'")


def positional(sql: str, nulls: tuple[str, ...] = ()) -> _Positional | None:
    """``null_folded(sql, nulls)`` with each named parameter left written ``?``, and the
    function that takes their values, in that order, from the mapping of parameters; or
    ``None`` where ``sql`` may hold a ``:name`` that is not a parameter (a comment, a
    string literal with a colon): such a statement keeps binding by name.

    The driver binds a mapping by name: for each parameter it makes a ``str`` of the name
    from the statement and looks it up (~400 instructions each, 27 an enqueue's two
    inserts). A tuple it binds by position, and ``itemgetter`` reads the values in C.
    """
    key = (sql, nulls)
    if key in _POSITIONAL:
        return _POSITIONAL[key]
    found = None
    plain = "--" not in sql and "/*" not in sql
    if plain and not any(":" in literal for literal in _LITERAL.findall(sql)):
        names: list[str] = []

        def place(match: re.Match[str]) -> str:
            names.append(match.group(1))
            return "?"

        text = _PARAMETER.sub(place, null_folded(sql, nulls))
        found = text, _values_of(names)
    if len(_POSITIONAL) >= _NULL_FOLDED_MAX:
        _POSITIONAL.clear()
    _POSITIONAL[key] = found
    return found


def _values_of(names: list[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` from a mapping, as a tuple (``itemgetter`` of one name
    returns the value itself, of none cannot be made)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    return lambda params: tuple([params[name] for name in names])


# A statement's text with its ``(:rows)`` as that many rows of ``width`` ``?`` each and its
# other parameters written ``?``, and the names those read before and after the rows
# (``SqliteTransaction.rows_query``), by the statement and the counts: a few sizes recur
# (a worker's batches and groups), each built once. ``None``: the statement may hold a
# ``:name`` that is not a parameter, and binds its rows by name.
_RowsText = tuple[str, tuple[str, ...], tuple[str, ...]]
_ROWS_SQL: dict[tuple[str, int, int], _RowsText | None] = {}
_ROW_NAMES: dict[tuple[int, int], list[str]] = {}
_ROWS_MAX = 256
# Where a statement takes its rows as bound values (``json_each(:rows)`` takes JSON text).
_VALUES_ROWS = "VALUES (:rows)"


def _row_names(width: int, rows: int) -> list[str]:
    names = _ROW_NAMES.get((width, rows))
    if names is None:
        names = [f"r{row}_{column}" for row in range(rows) for column in range(width)]
        if len(_ROW_NAMES) >= _ROWS_MAX:
            _ROW_NAMES.clear()
        _ROW_NAMES[(width, rows)] = names
    return names


def _rows_text(sql: str, width: int, rows: int) -> _RowsText | None:
    """``sql`` with ``rows`` rows of ``width`` ``?`` for its ``(:rows)`` and each other
    named parameter ``?``; the names of those before the rows and after them."""
    key = (sql, width, rows)
    if key in _ROWS_SQL:
        return _ROWS_SQL[key]
    found = None
    head, tail = sql.split(_VALUES_ROWS, 1)
    plain = "--" not in sql and "/*" not in sql
    if plain and not any(":" in literal for literal in _LITERAL.findall(sql)):
        before: list[str] = []
        after: list[str] = []

        def placed(names: list[str]) -> Callable[[re.Match[str]], str]:
            def place(match: re.Match[str]) -> str:
                names.append(match.group(1))
                return "?"

            return place

        row = "(" + ", ".join(["?"] * width) + ")"
        text = (
            _PARAMETER.sub(placed(before), head)
            + "VALUES "
            + ", ".join([row] * rows)
            + _PARAMETER.sub(placed(after), tail)
        )
        found = text, tuple(before), tuple(after)
    if len(_ROWS_SQL) >= _ROWS_MAX:
        _ROWS_SQL.clear()
    _ROWS_SQL[key] = found
    return found


def _rows_named(sql: str, width: int, rows: int) -> str:
    """``sql`` with ``rows`` rows of named parameters (``_row_names``) for its ``(:rows)``."""
    names = iter(_row_names(width, rows))
    placed = ", ".join(
        "(" + ", ".join(f":{next(names)}" for _ in range(width)) + ")" for _ in range(rows)
    )
    return sql.replace(_VALUES_ROWS, "VALUES " + placed)


class SqliteTransaction(SqlTransaction):
    """The verbs on a SQLite connection: an insert's new id is the cursor's ``lastrowid``;
    a statement's many rows are bound values in the statement (``rows_query``)."""

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        """``name`` run with ``params`` bound by position where its text allows
        (``positional``): binding a mapping by name, the driver makes a ``str`` of each
        name in the statement and looks it up (~400 instructions a parameter, ~300
        parameters a traced job). A parameter missing from ``params`` is left to the
        driver's binding by name, which reports it."""
        sql = self._queries[name]
        if params:
            found = positional(sql)
            if found is not None:
                text, values_of = found
                try:
                    values = values_of(params)
                except KeyError:
                    pass
                else:
                    return self.statements.execute(text, values)
        return self.statements.execute(sql, params or {})

    def execute_nullable(self, name: str, params: Mapping[str, Any]) -> Any:
        """``execute`` with each ``None`` value written ``NULL`` in the statement
        (``null_folded``, as ``inserted_id`` does), not bound: the driver binds ``None``
        only after a failed adapter lookup that raises and clears an ``AttributeError``
        (~3,200 instructions each; a new entity's version row has three). Each set of
        ``None`` names is its own statement text, prepared once by the driver's cache.
        For statements whose parameters are often ``None``; asking every statement's
        values cost more than it saved (comparing each value with ``None``)."""
        nulls = tuple([key for key, value in params.items() if value is None])
        sql = self._queries[name]
        found = positional(sql, nulls)
        if found is None:
            return self.statements.execute(null_folded(sql, nulls), params)
        text, values_of = found
        return self.statements.execute(text, values_of(params))

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """``SqlTransaction.executemany`` with each row's values bound by position where
        the statement's text allows (``positional``, as ``execute``): a pack's
        ``rq_trace_resources`` entries (three a traced job) bound three names each."""
        sql = self._queries[name]
        found = positional(sql)
        if found is not None:
            text, values_of = found
            try:
                values = [values_of(row) for row in rows]
            except KeyError:
                pass
            else:
                self.connection.cursor().executemany(text, values)
                return
        self.connection.cursor().executemany(sql, rows)

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        """Insert jobs, one statement each. Each inserted row's ``job.enqueued`` pack is
        written by that statement, in the row itself (``rq_jobs.enqueued``, migration 0023;
        read through the view ``rq_packs``): ``job_insert`` builds it from the values it
        inserts, as ``lifecycle_packs.enqueued_event`` does from ``params``; no event is
        built here. A row that ``ON CONFLICT`` skips gets none."""
        return [self._job_insert_one(p) for p in params]

    def rows_query(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> tuple[str, Any]:
        """``name``'s SQL with one ``(?, ?, ...)`` per row in place of its ``VALUES
        (:rows)`` (a multi-row ``VALUES``) and its other parameters ``?``, and the values:
        ``params``' and the rows', in the order of the text. A statement without it
        takes ``rows`` as one JSON text (``rows_param``, read with ``json_each``).

        A lease batch and a group's acks were a JSON text per statement, written by the
        encoder and parsed again by SQLite for each value it read (``json_extract``):
        ~15,000 instructions of a drained job. Then their values were bound by name
        (``:r0_0``...), the driver making a ``str`` of each name and looking it up: by
        position, a batch's values are one list. Each count of rows is its own statement
        text, prepared once by the driver's cache (a batch's rows are as many as the
        worker's free slots). A statement's parameters are bounded by
        ``SQLITE_LIMIT_VARIABLE_NUMBER`` (32,766 since SQLite 3.32): ``rows_executed``
        splits ``rows`` to stay under it (a worker's batch or group is one statement).
        """
        sql = self._queries[name]
        if _VALUES_ROWS not in sql:
            return super().rows_query(name, columns, rows, params)
        width = len(columns)
        found = _rows_text(sql, width, len(rows))
        if found is None:  # by name
            values = dict(params)
            names = _row_names(width, len(rows))
            values.update(zip(names, [v for row in rows for v in row], strict=True))
            return _rows_named(sql, width, len(rows)), values
        text, before, after = found
        bound = [params[n] for n in before]
        for row in rows:
            bound += row
        if len(bound) != len(before) + width * len(rows):
            raise ValueError(f"{name}: rows of other than {width} values")
        if after:
            bound += [params[n] for n in after]
        return text, bound

    def rows_executed(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> list[Any]:
        """``rows_query``'s statement run over ``rows``, as many rows a statement as
        SQLite's limit on its parameters allows (one for any worker's batch). Bound by
        position, a name the statement uses twice (the lease's ``:lease_now``) is two."""
        reserved = len(params)
        sql = self._queries[name]
        if _VALUES_ROWS in sql:
            found = _rows_text(sql, len(columns), 1)
            if found is not None:
                reserved = len(found[1]) + len(found[2])
        per_statement = self.rows_per_statement(len(columns), reserved=reserved)
        execute = self.connection.execute
        return [
            execute(*self.rows_query(name, columns, rows[start : start + per_statement], params))
            for start in range(0, len(rows), per_statement)
        ]

    def jobs_complete(self, params: JobsComplete) -> set[int]:
        """``SqlTransaction.jobs_complete``; for a caller that says whether the jobs have
        ordering keys (``params.ordered``, the worker's group commit), without
        ``RETURNING``: SQLite builds a temporary table for it at each run, ~8,000
        instructions of a drained no-op job. The rows the compare-and-set changed are
        counted: all of the group's, or none, is the answer (one row each time). When a
        lease among others was lost, the rows as the statement left them name those it
        changed (``jobs_completed_by``): each of them has its row's hlc, the group's finish
        time, ``succeeded`` and no owner. A row it did not change looks so only if another
        ack gave it the same hlc and time; then more rows match than changed, and the
        statement is refused whole (``StorageError``: the caller rolls back and tries
        again, with a new time and new clocks)."""
        if params.ordered is None:
            return super().jobs_complete(params)
        jobs = params.jobs
        if not jobs:
            return set()
        scalars = {"now": params.now}
        counted = self.rows_executed("jobs_complete_counted", JOBS_COMPLETE_COLUMNS, jobs, scalars)
        changed = sum(cursor.rowcount for cursor in counted)
        if changed == len(jobs):
            held = {job[0] for job in jobs}
        elif changed <= 0:
            return set()
        else:
            marks = [(job_id, hlc) for job_id, _, _, hlc in jobs]
            held = {
                int(row[0])
                for cursor in self.rows_executed(
                    "jobs_completed_by", ("job_ids", "hlcs"), marks, scalars
                )
                for row in cursor.fetchall()
            }
            if len(held) != changed:
                raise StorageError(
                    f"a group's acks changed {changed} rows and {len(held)} look so; "
                    "rolled back, to be tried again"
                )
        if params.ordered:
            # An ack makes another job ready only behind its ordering key (as in
            # ``SqlTransaction.jobs_complete``).
            self.jobs_changed = True
        return held

    def rows_inserted_ids(self, cursor: Any, rows: int) -> list[int]:
        """The new ids of a multi-row insert into ``rq_trace``: ``lastrowid`` and the
        ``rows - 1`` below it. Each new rowid is the largest one plus one (``rq_trace.id`` is
        a rowid without ``AUTOINCREMENT``, far below 2**63), so one statement's rows get
        consecutive ids in the order of its ``VALUES``; ``RETURNING id`` built a temporary
        table and a Python int per row (two packs a drained job) to say the same."""
        if cursor.rowcount != rows:
            raise StorageError(f"{rows} packs to insert, {cursor.rowcount} inserted")
        last = int(cursor.lastrowid)
        return list(range(last - rows + 1, last + 1))

    def inserted_id(self, name: str, params: Mapping[str, Any]) -> int | None:
        """``SqlTransaction.inserted_id`` from the cursor's ``lastrowid`` (SQLite's
        ``RETURNING`` builds a temporary table each time it runs: ~15 µs of an insert in its
        own transaction), with the parameters that are ``None`` written ``NULL`` in the
        statement, not bound.

        The driver binds a ``None`` (or ``bytes``) only after looking for an adapter for
        it, a failed attribute lookup that formats an ``AttributeError`` (~1 µs each):
        an enqueue's insert has seven such parameters, mostly ``None``. Each set of
        ``None`` names is its own statement text, prepared once by the driver's cache;
        the bound values are the same (a parameter absent from the text is not read).
        The others are bound by position (``positional``), not by name.
        """
        nulls = tuple([key for key, value in params.items() if value is None])
        sql = self._queries[name]
        found = positional(sql, nulls)
        if found is None:
            cursor = self.connection.execute(null_folded(sql, nulls), params)
        else:
            text, values_of = found
            cursor = self.connection.execute(text, values_of(params))
        return int(cursor.lastrowid) if cursor.rowcount > 0 else None


class SqliteStorage:
    """``Storage`` on one SQLite file; one connection per thread."""

    dialect = "sqlite"

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000) -> None:
        self.url = url
        self.path, options = parse_sqlite_url(url)
        self.synchronous = options.get("synchronous", "NORMAL").upper()
        if self.synchronous not in _SYNC_MODES:
            raise ConfigurationError(f"{url!r}: synchronous must be one of {sorted(_SYNC_MODES)}")
        page_size = options.get("page_size", str(_PAGE_SIZE))
        self.page_size = int(page_size) if page_size.isdigit() else 0
        if self.page_size not in _PAGE_SIZES:
            raise ConfigurationError(
                f"{url!r}: page_size must be a power of two from 512 to 65536 (default "
                f"{_PAGE_SIZE}); it applies when replayq creates the database file"
            )
        try:
            self.busy_timeout_ms = int(options.get("busy_timeout", busy_timeout_ms))
        except ValueError:
            self.busy_timeout_ms = -1
        if self.busy_timeout_ms < 0:
            raise ConfigurationError(
                f"{url!r}: busy_timeout is the milliseconds a write waits for the lock (e.g. 5000)"
            )
        self.queries = load_queries("replayq.storage.sqlite")
        self._local = threading.local()
        self._all: list[Connection] = []
        self._all_lock = threading.Lock()
        # Connections ``close()`` left to the thread inside a block on them, which closes
        # each as its block ends (``_leave``): a child forked before then inherits them.
        self._left: list[Connection] = []
        self._closed = False  # by ``close()``: every later use raises ``StorageError``
        self._writer_key = _writer_key(self.path)
        self._writer = _writer_of(self._writer_key)
        with _WRITERS_LOCK:
            _STORAGES.add(self)
        # Set by SQLITE_FULL: writes wait until a checkpoint has emptied the WAL (see
        # ``_checkpoint_after_full``), so that space freed goes to the checkpoint first.
        self._full = threading.Event()
        # Change watchers of this process's workers (``listen``), poked on each commit.
        self._watchers: list[Watcher] = []
        parent = Path(self.path).expanduser().resolve().parent
        self._directory = parent
        in_file = self.path != ":memory:" and not self.path.startswith("file:")
        self._wal_path = f"{self.path}-wal" if in_file else None
        self._wal_retry_above = 0
        if self.path != ":memory:" and not parent.is_dir():
            raise DatabaseUnavailableError(
                f"cannot open SQLite database {self.path!r}: "
                f"directory {str(parent)!r} does not exist"
            )
        # The learned dictionaries of format 5 packs: one set for every connection of this
        # storage (``register_sqlite``), read from the file the first time one is met.
        self.pack_dictionaries = PackDictionaries(packs.DICTIONARY_2, self._dictionary_text)
        # The file the dictionaries are read from when met (``_dictionary_text``), named
        # now: a relative path names another file, or none, once the process changes
        # directory, while this storage's connections stay open on this one. Read-only:
        # a missing file is not made.
        self._dictionary_uri = None
        if in_file:
            self._dictionary_uri = f"file:{quote(str(Path(self.path).resolve()))}?mode=ro"
        self._connection()  # fail now, with a clear message, if the file cannot be opened

    def _connection(self) -> Connection:
        # One thread's state throughout: a ``close()`` meanwhile makes ``_local`` a new one.
        local = self._local
        conn: Connection | None = getattr(local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise storage_closed(f"SQLite database {self.path!r}")
        # A forked child's first connection to the file: the parent's are closed first, or
        # the use is refused (fork.py).
        fork.leave_inherited(self._writer_key, self.path)
        try:
            with unsealed():  # replayq's own database, also during a sealed replay
                create_private(self.path)
                conn = fork.connect(self.path, timeout=0)
        except (sqlite3.Error, OSError) as exc:
            raise DatabaseUnavailableError(
                f"cannot open SQLite database {self.path!r}: {exc}"
            ) from exc
        # In use until set up, and known to a fork from here on: a connection that has
        # read nothing yet holds no lock, so one a child missed before this is harmless.
        conn.inside = 1
        with self._all_lock:
            closed = self._closed  # by ``close()`` since the look above: not kept
            if not closed:
                self._all.append(conn)
        if closed:
            conn.close()
            raise storage_closed(f"SQLite database {self.path!r}")
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            # Switching the mode needs the file to itself; asking does not, so a process
            # opening a WAL file while another connection writes is not blocked.
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                # Takes effect only on a file with no page yet: switching to WAL writes
                # the first one. A database that exists keeps the page size it has.
                conn.execute(f"PRAGMA page_size = {self.page_size}")  # checked: _PAGE_SIZES
                conn.execute("PRAGMA journal_mode = WAL")
            # PRAGMA values cannot be bound parameters; this one is checked against _SYNC_MODES.
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # A job's commit dirties ~8 pages (rows, indexes, trace; docs/benchmarks.md): at
            # the default 1000-page WAL a checkpoint (two fsyncs) came every ~100 jobs. Durability
            # is the same; the WAL reaches ~16 MB between checkpoints, truncated above 64 MB.
            local.page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            local.writes = 0
            local.wal_pages = 0
            local.changes_seen = 0
            self._fit_wal(conn, local)
            conn.execute("PRAGMA foreign_keys = ON")
            # Trace packs are deflated (storage/packs.py, format 2): the SQL that reads their
            # events (the rq_events view, trace windows, gc's blob references) decodes them
            # through this function, so every connection replayq opens has it.
            packs.register_sqlite(conn, self.pack_dictionaries)
        except (sqlite3.Error, OSError) as exc:
            self._discard(conn)  # not kept half set up
            raise DatabaseUnavailableError(
                f"cannot open SQLite database {self.path!r}: {exc}"
            ) from exc
        finally:
            _leave(conn)  # closed here if ``close()`` ran meanwhile
        local.conn = conn
        return conn

    # -- learned pack dictionaries (``PackLearning``) -----------------------------------------

    def attempt_starts(self, job_id: int, job_type: str) -> None:
        """``PackLearning``: job ``job_id``'s new packs use its type's dictionary. At the
        type's first attempt in this process its row is read (one short read); at the
        first attempt after two of its jobs succeeded here while none was known, one is
        learned from their traces (``_learn``). Never in an ack's transaction. Whatever
        either raises is logged, not raised: the attempt runs (its packs format 2)."""
        dictionaries = self.pack_dictionaries
        if dictionaries.unread(job_type):
            try:
                with self.transaction(readonly=True) as tx:
                    self._dictionary_found(
                        job_type, tx.fetchone("pack_dictionary_of_type", {"job_type": job_type})
                    )
            except Exception as exc:  # a pack format's bookkeeping: never the attempt's end
                log.warning("trace pack dictionary of job type %r not read: %s", job_type, exc)
        else:
            jobs = dictionaries.due(job_type)
            if jobs is not None:
                self._learn(job_type, jobs)
        dictionaries.attempt(job_id, job_type)

    def _learn(self, job_type: str, jobs: tuple[int, int]) -> None:
        """``job_type``'s row read again (another process may have learned it since), or a
        dictionary learned from the traces of ``jobs`` (two succeeded jobs of the type: the
        names both hold, ``pack_dictionaries.shape``) and kept there: one short write
        transaction. A failure is logged and tried again at a later attempt's start
        (three tries); until one holds, the type's packs stay format 2 in this process.

        Only if the write lock is free now: the attempt waits for it (it runs on the
        executor's thread, before the handler). A lock another writer holds (this
        process's, ``_WRITERS``, or another's: ``busy_timeout`` 0 for this transaction)
        leaves the two jobs due at a later attempt's start, not counted as a try."""
        of_type = {"job_type": job_type}
        job_id, earlier = jobs
        writer = self._writer
        if not writer.acquire(blocking=False):
            self.pack_dictionaries.postponed(job_type, jobs)
            return
        writer.release()  # taken again by the transaction, at once unless raced
        try:
            conn = getattr(self._local, "conn", None) or self._connection()
            with _using(conn, self.path):
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    with self.transaction() as tx:
                        found = tx.fetchone("pack_dictionary_of_type", of_type)
                        if found is None:
                            text = packs.learned_text(
                                tx.trace_query(TraceQuery(job_id=job_id)),
                                tx.trace_query(TraceQuery(job_id=earlier)),
                            )
                            if not text:
                                return
                            row = {**of_type, "text": text, "job_id": job_id, "now": time.time()}
                            tx.execute("pack_dictionary_put", row)
                            found = tx.fetchone("pack_dictionary_of_type", of_type)
                finally:
                    with contextlib.suppress(sqlite3.Error):  # closed since (``_discard``)
                        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        except Exception as exc:  # a trace that no longer decodes (zlib.error) too
            if _busy(exc):
                self.pack_dictionaries.postponed(job_type, jobs)
                return
            log.warning("no trace pack dictionary learned for job type %r: %s", job_type, exc)
            self.pack_dictionaries.failed(job_type, jobs)
            return
        self._dictionary_found(job_type, found)

    def _dictionary_found(self, job_type: str, found: Mapping[str, Any] | None) -> None:
        if found is not None:
            self.pack_dictionaries.learned(job_type, int(found["id"]), bytes(found["text"]))

    def _dictionary_text(self, dictionary_id: int) -> bytes | None:
        """A learned dictionary this process has not met yet (another process learned it
        since), read on a connection of its own (the loader is not told which of this
        storage's connections ``rq_pack_json`` runs on), read-only, on the file this
        storage opened (``_dictionary_uri``) whatever the process's directory is now."""
        if self.path == ":memory:":
            return None  # a database of this process alone: it learned all it holds
        target, uri = self.path, False
        if self._dictionary_uri is not None:
            target, uri = self._dictionary_uri, True
        with unsealed():
            try:
                conn = sqlite3.connect(target, timeout=self.busy_timeout_ms / 1000, uri=uri)
            except sqlite3.Error:
                return None
            try:
                row = conn.execute(
                    self.queries["pack_dictionary_text"], {"id": dictionary_id}
                ).fetchone()
            except sqlite3.Error:
                row = None
            finally:
                conn.close()
        return None if row is None else bytes(row[0])

    def _fit_wal(self, conn: sqlite3.Connection, local: threading.local) -> None:
        """Size this connection's automatic checkpoint to the disk's free space.

        At most ``_WAL_AUTOCHECKPOINT_BYTES`` (16 MB), and at most a quarter of the free
        space: on a small or nearly full disk the WAL is checkpointed (and, past
        ``journal_size_limit``, truncated) long before it could fill the disk, which
        would leave no room for the checkpoint that empties it.

        ``local`` is the thread's state of ``conn`` (``_local`` as its block began: a
        ``close()`` since has made ``_local`` a new, empty one).
        """
        pages = _WAL_AUTOCHECKPOINT_BYTES // local.page_size
        if self.path != ":memory:":
            try:
                free = shutil.disk_usage(self._directory).free
            except OSError:
                free = None
            if free is not None:
                pages = max(_WAL_MIN_PAGES, min(pages, free // 4 // local.page_size))
        if pages != local.wal_pages:
            conn.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")
            limit = min(_JOURNAL_SIZE_LIMIT_BYTES, pages * local.page_size)
            conn.execute(f"PRAGMA journal_size_limit = {int(limit)}")
            local.wal_pages = pages

    def _checkpoint_after_full(self, conn: sqlite3.Connection, local: threading.local) -> None:
        """After ``SQLITE_FULL``: empty the WAL before writing again, or say why not.

        A write would append to the WAL (it cannot restart before a complete
        checkpoint) and take the very space the checkpoint needs to copy pages into
        the database file. So until ``wal_checkpoint(TRUNCATE)`` succeeds, every write
        is refused as unavailable, and the worker's backoff tries again.
        """
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            _rollback(conn)
            raise storage_error(
                f"{self.path!r}: the disk was full and the WAL cannot be checkpointed yet", exc
            ) from exc
        if busy:
            raise DatabaseUnavailableError(
                f"{self.path!r}: database or disk is full; the WAL checkpoint that must run "
                "first is waiting for readers"
            )
        self._full.clear()
        log.info("%s: the WAL is checkpointed after a full disk; writes resume", self.path)
        self._fit_wal(conn, local)

    def transaction(self, *, readonly: bool = False) -> _Transaction:
        """A transaction on this thread's connection (``BEGIN IMMEDIATE`` unless
        ``readonly``); commits when the block ends, rolls back if it raises."""
        return _Transaction(self, readonly)

    def autocommit(self) -> _Transaction:
        """Verbs on this thread's connection without ``BEGIN``: each statement commits (or
        fails) by itself (``protocol.Autocommit``). An enqueue is one statement (its row,
        which holds its pack): ``BEGIN IMMEDIATE`` and ``COMMIT`` around it were two
        more statements for nothing. On a connection already inside a transaction it is
        refused, as ``transaction()`` is there (``_begin``)."""
        return _Transaction(self, False, autocommit=True)

    def snapshot_read(self) -> _Transaction:
        """Reads on this thread's connection without ``BEGIN``: each statement reads the
        database as one snapshot of its own (``protocol.SnapshotRead``). A read that is one
        statement (``ctx.state.get`` of an entity on the main branch) needs no
        transaction around it: ``BEGIN`` and ``COMMIT`` were two more statements for the
        same snapshot. Refused inside a block of ``transaction()``, as ``autocommit`` is."""
        return _Transaction(self, True, autocommit=True)

    def _begin(
        self, readonly: bool, autocommit: bool = False
    ) -> tuple[Connection, SqliteTransaction, threading.Lock | None]:
        """``BEGIN`` on this thread's connection (none with ``autocommit``), the verbs on
        it, and the process's writer lock it took (``_WRITERS``; ``None`` if none): the
        transaction releases that one, whatever thread ends it and whatever ``close()``
        did meanwhile. Whatever raises here (a ``KeyboardInterrupt`` as ``BEGIN``
        returns) releases it and rolls back: a lock kept by nobody made every later write
        of the process wait ``busy_timeout`` first.

        Refused inside a block of this thread's ``transaction()`` (an ``App.enqueue`` in
        it), and that transaction left as it was. SQLite's own refusal of a nested
        ``BEGIN`` would go through ``_fault``, whose rollback ends the open transaction:
        what it wrote before was lost, and what it wrote after committed statement by
        statement. A transaction no block holds (left open when a failed ``ROLLBACK``
        could not end it) is rolled back here, and this one goes ahead.

        The connection counts the block (``inside``) from before its first statement to
        its end (``_Transaction.__exit__``): a child forked meanwhile must not close it
        (``fork.py``), nor ``close()`` on another thread (``_enter``).
        """
        local = self._local
        # ``_connection``'s first look inlined: the thread's connection, once it has one.
        conn = getattr(local, "conn", None) or self._connection()
        inside = _enter(conn)
        if inside < 0:  # closed by ``close()`` on another thread, which has not forgotten it yet
            raise self._cut_short(inside)
        orphan = conn.in_transaction
        if orphan and inside:
            _leave(conn)
            raise StorageError(
                f"cannot begin a transaction on {self.path!r}: this thread's connection "
                "is inside one already, and transactions do not nest (inside a "
                "transaction, enqueue with its own tx: App.insert_job(tx, request))"
            )
        held = None
        try:
            if orphan:
                _rollback(conn)
            if not readonly:
                if self._full.is_set():
                    self._checkpoint_after_full(conn, local)
                writes = local.writes = local.writes + 1
                if writes % _RETUNE_EVERY == 0:
                    self._fit_wal(conn, local)
                # The process's writers queue here (``_WRITERS``); past ``busy_timeout`` the
                # write goes on to SQLite's lock and its own wait, as without the queue.
                writer = self._writer
                held = writer if writer.acquire(timeout=self.busy_timeout_ms / 1000) else None
            if not autocommit:
                conn.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
            # The pack a transaction on this connection committed last: the next one's
            # events of the same attempt join it (storage/packs.py). Cleared until this one
            # commits; a read-only transaction writes no pack and leaves it as it is.
            carried = None
            if not readonly:
                carried, local.last_pack = getattr(local, "last_pack", None), None
            tx = SqliteTransaction(conn, self.queries, last_pack=carried)
            tx.pack_dictionaries = self.pack_dictionaries
        except sqlite3.Error as exc:
            if held is not None:
                held.release()
            try:
                self._fault(conn, exc)
            finally:
                _leave(conn)  # after the rollback: in use until then
            raise self._failure(f"cannot begin a transaction on {self.path!r}", exc) from exc
        except BaseException:
            try:
                with contextlib.suppress(sqlite3.Error):  # a connection ``close()`` closed
                    _rollback(conn)
            finally:
                _leave(conn)
                if held is not None:
                    held.release()
            raise
        return conn, tx, held

    def _end(
        self,
        conn: sqlite3.Connection,
        tx: SqliteTransaction,
        readonly: bool,
        exc: BaseException | None,
        autocommit: bool = False,
    ) -> None:
        """Commit ``tx``, or roll it back after ``exc`` (re-raised by the caller; a driver
        error is raised here as a storage error, the driver's as its ``__cause__``). With
        ``autocommit`` each statement committed by itself: there is nothing to end."""
        if exc is not None:
            if isinstance(exc, sqlite3.Error):
                self._fault(conn, exc)
                # Storage errors keep the driver's as __cause__ (as on PostgreSQL).
                raise self._failure(self.path, exc) from exc
            if not autocommit:
                _rollback(conn)
            return
        try:
            if not autocommit:
                conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._fault(conn, error)
            raise self._failure(f"commit failed on {self.path!r}", error) from error
        if not readonly:
            local = self._local
            if getattr(local, "conn", None) is not conn:
                return  # closed (``close()``) or given up (``_discard``) since it began
            local.last_pack = tx.last_pack
            if tx.jobs_changed:
                for watcher in self._watchers:
                    watcher.poke()
            # Most commits do not look at the WAL: only every _WAL_LOOK_EVERY_CHANGES rows.
            wal_path = self._wal_path
            if (
                wal_path is not None
                and conn.total_changes - local.changes_seen >= _WAL_LOOK_EVERY_CHANGES
            ):
                self._bound_wal(conn, wal_path, local)

    def _bound_wal(self, conn: sqlite3.Connection, wal_path: str, local: threading.local) -> None:
        """After a commit: restart a WAL that readers have let grow past twice its size.

        The automatic checkpoint is passive: it copies the WAL's pages into the
        database file, but the WAL restarts from its beginning only if no reader is
        still using it. Readers that always overlap (a dashboard polling, a long
        report) keep it growing, and on a small or nearly full disk it takes the
        room the checkpoint needs to grow the database file: no write could ever
        commit again, even once the readers stop. A ``RESTART`` checkpoint waits
        (``_WAL_RESTART_WAIT_MS``, not ``busy_timeout``: it holds the write lock, and a
        writer of another process waiting for it could time out) for the readers of the
        WAL to finish; readers that begin meanwhile read the database file.

        The wait is several short tries rather than one long one. SQLite's checkpoint
        reads the readers' marks once, then waits for the slot of the oldest; two
        readers that overlap can pass that slot between them, under a newer mark, for
        the whole wait (a try in three failed so, with the WAL then passing 3 and 4
        checkpoints' size). The next try reads the newer mark and does not wait for it.

        Called (``_end``) once this connection's commits have changed
        ``_WAL_LOOK_EVERY_CHANGES`` rows since the last look, not after every commit, and
        only with a WAL.
        """
        local.changes_seen = conn.total_changes
        try:
            size = os.stat(wal_path).st_size
        except OSError:
            return
        step = local.wal_pages * local.page_size
        if size <= max(_WAL_OVERGROWN * step, self._wal_retry_above):
            return
        deadline = time.monotonic() + _WAL_RESTART_WAIT_MS / 1000
        try:
            conn.execute(f"PRAGMA busy_timeout = {_WAL_RESTART_TRY_MS}")
            while True:
                busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                if not busy or frames < 0 or time.monotonic() >= deadline:
                    break
        except sqlite3.Error as exc:  # the next write meets the fault, and handles it
            log.debug("checkpoint of an overgrown WAL failed: %s", exc)
            busy, frames = 1, 0  # backs off a step, as a reader that outlasts the wait
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        if busy and frames < 0:
            return  # another connection is checkpointing (it holds the lock): next commit
        # A reader that outlasted the wait (a long report): the next commits do
        # not each wait for it again; the next try is once the WAL has grown a step more.
        self._wal_retry_above = size + step if busy else 0
        if busy:
            log.warning(
                "%s: the WAL is %d bytes: readers kept it from restarting (checkpoint "
                "starvation); tried again once it has grown by %d bytes",
                self.path,
                size,
                step,
            )

    def _failure(self, what: str, exc: sqlite3.Error) -> StorageError:
        """The replayq error for ``exc``; once the storage is closed, that it is (a block
        another thread cut short by ``close()``), not the closed connection's error."""
        if self._closed:
            return storage_closed(f"SQLite database {self.path!r}")
        return storage_error(what, exc, self.path)

    def _cut_short(self, inside: int) -> StorageError:
        """The error at the end of a block whose connection was closed by ``close()``
        (``inside`` is ``fork.CLOSED``, or ``fork.SHUT`` once its thread closed it), or
        inherited by a fork since the block began: the child cannot commit its parent's
        transaction, nor roll it back (``fork.py``)."""
        if inside in (fork.CLOSED, fork.SHUT):
            return storage_closed(f"SQLite database {self.path!r}")
        return StorageError(
            f"{self.path!r}: this process was forked inside a transaction, which belongs "
            "to the parent's connection: the child neither commits it nor rolls it back "
            "(the parent does, as its own block ends)"
        )

    def _fault(self, conn: sqlite3.Connection, exc: sqlite3.Error) -> None:
        if _is_full(exc):
            self._full.set()
        _after_fault(conn, exc)
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_READONLY:
            self._discard(conn)

    def _discard(self, conn: sqlite3.Connection) -> None:
        """Close this thread's connection; its next transaction opens a new one.

        After ``SQLITE_READONLY``: a connection opened while the file could not be
        written stays read-only after the file system is writable again.
        """
        with self._all_lock:
            self._all = [c for c in self._all if c is not conn]
        self._local.conn = None
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    def adopt(self, connection: Any) -> SqlTransaction:
        """Verbs on the caller's connection to this file, whatever its row factory.

        A ``sqlite3.Connection`` in autocommit (``isolation_level=None``) must be inside
        ``BEGIN`` already; in the module's default mode the insert itself opens the
        transaction, as the caller's own writes would. Any other DB-API connection
        (a framework's wrapper of ``sqlite3`` or ``aiosqlite``) is trusted to be on this
        file inside the caller's transaction: replayq cannot check it.
        """
        if self._closed:
            raise storage_closed(f"SQLite database {self.path!r}")
        if isinstance(connection, sqlite3.Connection):
            if not connection.in_transaction and connection.isolation_level is None:
                raise ConfigurationError(
                    "transactional enqueue needs an open transaction on the connection "
                    "(execute BEGIN, or any write, first)"
                )
        elif not callable(getattr(connection, "cursor", None)):
            raise ConfigurationError(
                f"transactional enqueue on SQLite takes a sqlite3.Connection (or another "
                f"DB-API connection to the same file), got {type(connection).__name__}"
            )
        tx = SqliteTransaction(TupleRows(connection), self.queries)
        tx.pack_dictionaries = self.pack_dictionaries
        return tx

    def _applied(self, conn: sqlite3.Connection) -> list[tuple[int, str, float]]:
        conn.execute(self.queries["migrations_create"])
        rows = conn.execute(self.queries["migrations_applied"]).fetchall()
        return [(int(version), str(name), float(at)) for version, name, at in rows]

    def _up_to_date(self, conn: sqlite3.Connection) -> bool:
        """Whether every migration is applied, asked without the write lock."""
        conn.execute("BEGIN")
        try:
            if not conn.execute(self.queries["migrations_table_exists"]).fetchone()[0]:
                return False
            rows = conn.execute(self.queries["migrations_applied"]).fetchall()
        finally:
            _rollback(conn)  # read only: nothing to commit
        applied = [(int(version), str(name), float(at)) for version, name, at in rows]
        return not migrate.pending(migrate.migration_status(applied, _MIGRATIONS))

    def migrate(self, now: float) -> list[MigrationStatus]:
        """Apply pending migrations; with none pending, the write lock is never taken.

        So a process whose app opens while the caller's own transaction holds the write
        lock (transactional enqueue as the first use) does not wait on itself.
        """
        with _using(self._connection(), self.path) as conn:
            return self._migrate(conn, now)

    def _migrate(self, conn: Connection, now: float) -> list[MigrationStatus]:
        try:
            if self._up_to_date(conn):
                return []
            own = migrate.replayq_names_of(_MIGRATIONS)
            # Off for the upgrade (step 1 of SQLite's procedure; it can only be switched
            # outside a transaction): a migration drops a table it copies, and with foreign
            # keys on, that drop deletes its rows first, which deleted the rows of an
            # owner's table that references it ON DELETE CASCADE (or refused the upgrade,
            # without an action). The copy keeps every row and id, so each reference holds.
            conn.execute("PRAGMA foreign_keys = OFF")
            try:
                conn.execute("BEGIN IMMEDIATE")
                done = migrate.apply_pending(
                    _MIGRATIONS,
                    self._applied(conn),
                    lambda script: run_migration(conn, script, own),
                    lambda version, name: conn.execute(
                        self.queries["migration_record"],
                        {"version": version, "name": name, "now": now},
                    ),
                )
                conn.execute("COMMIT")
            finally:
                _rollback(conn)  # after any failure, COMMIT's own included
                conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise storage_error(f"cannot migrate {self.path!r}", exc) from exc
        return done

    def migration_status(self) -> list[MigrationStatus]:
        with _using(self._connection(), self.path) as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    return migrate.migration_status(self._applied(conn), _MIGRATIONS)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise storage_error(f"cannot read the migrations of {self.path!r}", exc) from exc

    def listen(self, callback: Callable[[str | None], None]) -> Watcher:
        """Call ``callback(None)`` when the file may hold new work; ``close()`` the result.

        SQLite cannot say which queue changed: every commit to the file wakes the
        listener (``watch.py``), at once for this process's own commits.
        """
        if self._closed:
            raise storage_closed(f"SQLite database {self.path!r}")
        fork.leave_inherited(self._writer_key, self.path)  # before the watch's own (fork.py)
        watcher = Watcher(self.path, callback, on_close=self._unwatch)
        with self._all_lock:
            self._watchers = [*self._watchers, watcher]
        return watcher

    def _unwatch(self, watcher: Watcher) -> None:
        with self._all_lock:
            self._watchers = [w for w in self._watchers if w is not watcher]

    def connections(self) -> int:
        """One per thread that used this storage (the connection lives as long as the storage)."""
        with self._all_lock:
            return len(self._all)

    def close(self) -> None:
        """Close every connection of the storage; every later use of it raises
        ``StorageError`` (closed), as does the end of a block another thread had open on
        it: that block never commits, and its connection is closed by its own thread as
        it ends (closing it under a running statement crashed the process)."""
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                with conn.guard:
                    in_use = conn.inside > 0
                    conn.inside = fork.CLOSED  # a block open on it ends without committing
                if in_use:
                    self._left.append(conn)  # closed by its thread as the block ends
                else:
                    conn.close()
            self._all.clear()
        self._local = threading.local()


class _Transaction:
    """``SqliteStorage.transaction``: a class, not a ``@contextmanager`` generator, whose
    making, entering and leaving cost ~5,000 instructions of every transaction (an
    enqueue is one)."""

    __slots__ = ("_autocommit", "_conn", "_held", "_readonly", "_storage", "_tx")

    def __init__(self, storage: SqliteStorage, readonly: bool, autocommit: bool = False) -> None:
        self._storage = storage
        self._readonly = readonly
        self._autocommit = autocommit

    def __enter__(self) -> SqliteTransaction:
        self._conn, self._tx, self._held = self._storage._begin(self._readonly, self._autocommit)
        return self._tx

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        storage = self._storage
        conn = self._conn
        inside = conn.inside
        try:
            if inside <= 0:  # ``close()`` or a fork since the block began (``fork.py``)
                raise storage._cut_short(inside) from exc
            storage._end(conn, self._tx, self._readonly, exc, self._autocommit)
        finally:
            _leave(conn)  # closes it if ``close()`` ran meanwhile
            held = self._held
            if held is not None:
                self._held = None
                held.release()


# The optional capability the worker looks for, checked here by the type checker.
_LISTENER: type[Listener] = SqliteStorage
_SNAPSHOT_READ: type[SnapshotRead] = SqliteStorage
