"""PostgreSQL backend: many worker hosts sharing one database (psycopg 3 + psycopg_pool).

Known limits, up front:

* Isolation is READ COMMITTED everywhere. Correctness comes from row locks and
  compare-and-set updates, not from SERIALIZABLE: leasing is one
  ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)`` statement, and every later
  state change is ``WHERE id = … AND owner_token = … AND state = 'running'``.
  Read-only calls (listing, traces) run in ``READ ONLY`` transactions.
* Leases are judged by the server's clock (``statement_timestamp()``) when the
  worker's app runs on the real clock: granted, extended and reaped in one time
  whatever each worker host's clock says; an injected test clock judges them itself.
  Which jobs are due (``run_at``) is still read in the worker's clock.
* Per-key ordering: the lease query only offers the oldest unfinished job of an
  ordering key, and only while no job of that key is running. Two claimers whose
  statement snapshots differ (an enqueue that committed late with a lower id)
  could still both pass that check, so the unique partial index
  ``rq_jobs_one_running_per_key`` makes "at most one running job per key" a
  database invariant; the rare claim that collides with it is rolled back to a
  savepoint and retried. We chose the index over an advisory lock on the key hash
  because an advisory lock taken inside the claiming statement is acquired after
  that statement's snapshot, so it cannot close the race on its own, while a
  UNIQUE index cannot be wrong. FIFO follows id order among the jobs visible when a
  lease runs: two enqueues of one key that commit out of id order may run out of
  order (never concurrently).
* Wake-ups: ``job_insert`` (and release, redelivery, requeue) send
  ``pg_notify('replayq_jobs', queue)`` in their own transaction, delivered on
  commit. A ``Notifier`` thread holds one dedicated connection outside the pool,
  re-``LISTEN``s after every reconnect and wakes its callback then, since
  notifications sent while it was away are lost. Workers keep their fallback poll.
  ``listen`` makes this backend a ``storage.protocol.Listener``, the optional
  capability a worker checks for with ``isinstance``; SQLite has none and polls.
  The channel is per database; the payload names the installation (the oid of its
  ``rq_jobs`` table) beside the queue, and a listener ignores another installation's
  wake-ups, so installations in sibling schemas do not wake each other's workers.
* Connections: a ``ConnectionPool`` of ``?pool_size=`` connections (default 4)
  per ``PostgresStorage``; a worker uses one for the dispatcher, one for heartbeats,
  one for a group commit of acks past their window and one per executor while it
  settles a job, so give it ``concurrency + 3`` to never wait (a wait for a pooled
  connection happens before a transaction opens, never inside one). A connection
  broken by a server restart fails the call it is in (``DatabaseUnavailableError``)
  and is replaced by the pool; callers retry (``storage/reconnect.py``). An idle
  pooled connection whose session was killed is noticed at checkout without a round
  trip: its socket is readable (the server's FATAL message, then EOF), which an idle
  connection's never is. Once a
  call has found the database gone, a checkout waits ``OUTAGE_WAIT``, not
  ``pool_timeout``, until the pool connects again: callers retry with their own
  backoff, and a worker told to stop in an outage is not held for 30 s. After
  ``close()`` every use raises ``StorageError`` (closed), not the pool's ``PoolClosed``
  as an outage to wait out; a block open meanwhile finishes (the pool waits up to 5 s).
* A worker frozen inside a transaction (SIGSTOP, a paused VM) holds its job row
  ``FOR SHARE`` (the fencing check), and the reaper skips locked rows; in a step's
  commit, the row of each lock a write is under too (its fence), and another worker's
  acquisition of that lock waits for it (``lock_fence`` in ``locks.sql``). Pooled
  sessions therefore set ``idle_in_transaction_session_timeout``
  (``?idle_in_transaction_timeout=`` seconds, default 10): the server ends a
  frozen session and releases its locks, the reaper takes the job, and the
  worker, when it resumes, finds its connection gone and its lease lost. The
  server's reason (SQLSTATE 25P03, which psycopg classes as ``InternalError``) is
  ``DatabaseUnavailableError`` like any ended session, never a job's failure. Not
  inside a ``pipelined`` commit between its statements and their ``Sync``: the server
  arms that timeout only at a ``Sync``, and no other setting of PostgreSQL 15 ends such
  a session (17 has ``transaction_timeout``), so a worker frozen there keeps the job
  until it thaws (its commit then goes through, once) or its process ends (rolled
  back, the job reaped): ``tests/acceptance/test_postgres_frozen_pipeline.py``.
* A server that takes no writes (SQLSTATE 25006: a standby after a failover, or
  ``default_transaction_read_only``) is ``DatabaseUnavailableError`` like a server
  that is down, unless replayq asked for a read-only transaction itself. The
  session that met it is closed, so the pool's next connection can reach the
  primary that took over. Transactions begin with the server's default mode
  (never ``BEGIN READ WRITE``, which would override that setting, and which a
  standby refuses with another code).
* A statement the server cancels (SQLSTATE 57014: a ``statement_timeout`` of the role or
  database, ``pg_cancel_backend``) is ``DatabaseUnavailableError`` too: its transaction
  rolled back and its session is good, and the same statement may pass a moment later
  (``tests/acceptance/test_postgres_statement_cancel.py``).
* Half-open sockets (a partitioned host): libpq TCP keepalives and
  ``tcp_user_timeout`` (``DEFAULT_TCP_USER_TIMEOUT_MS`` unless the URL sets it)
  turn a silent peer into an error within seconds instead of the kernel's
  ~15 minutes of retransmissions, so a worker never hangs on one.
* The ledger tier lives in day partitions (``rq_trace_ledger``, migration 0013) that gc
  makes before it writes into them and drops once their day has ended and their jobs are
  deleted: expiring a day is a ``DROP TABLE``, not a delete. Both take an ACCESS
  EXCLUSIVE lock on the partitioned table for a moment (each in a short transaction of
  its own), so a trace read in flight delays them and reads queue behind them. A read by
  job or by time probes one index per partition, one per day of the longest
  ``ledger_days``. The full tier stays in the unpartitioned ``rq_trace``.
* Schema upgrades are explicit (``replayq --db URL db upgrade``), serialised by
  ``pg_advisory_xact_lock`` and run in one transaction: DDL is transactional here,
  so a failed migration leaves the previous schema intact. The owner's indexes,
  triggers and rules on a relation a migration drops are made again after it, or the
  upgrade is refused naming them, as it is for the owner's views over it
  (``upgrade.py``): never dropped without a word.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import operator
import os
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool

from replayq import codec
from replayq.errors import (
    ConfigurationError,
    ConstraintViolationError,
    DatabaseUnavailableError,
    LeaseCollisionError,
    RowLockTimeoutError,
    StatementCancelledError,
    StorageError,
)
from replayq.model import Job, TraceEvent
from replayq.redaction import mask_url_passwords
from replayq.storage import migrate, packs
from replayq.storage.adopted import AsyncConnectionView, TupleRows
from replayq.storage.commits import CommitRefused
from replayq.storage.context_params import (
    IdemChange,
    IdemClaim,
    LockAcquire,
    LockChange,
    LockFilter,
    TraceFence,
    lock_timeout_ms,
)
from replayq.storage.context_verbs import lease_now, query_params
from replayq.storage.lifecycle_packs import enqueued_event
from replayq.storage.params import JobsComplete
from replayq.storage.postgres import upgrade
from replayq.storage.postgres.adapt import arrays_as_literals, column_names
from replayq.storage.protocol import (
    JobInsert,
    JobLease,
    Listener,
    Lock,
    MigrationStatus,
    storage_closed,
)
from replayq.storage.queries import load_queries
from replayq.storage.retention_params import LedgerDrop, LedgerDropped, LedgerPartitions
from replayq.storage.sql_transaction import JOBS_COMPLETE_COLUMNS, SqlTransaction, with_job_id

log = logging.getLogger("replayq.storage.postgres")


class _QuietDiscards(logging.Filter):
    """Drops psycopg_pool's warning for each closed connection handed back to the pool.

    replayq closes dead and read-only sessions on purpose and hands them back, once per
    retry in an outage; the outage itself is logged once, with its cause, by the caller.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("discarding closed connection")


logging.getLogger("psycopg.pool").addFilter(_QuietDiscards())

_MIGRATIONS = "replayq.storage.postgres.migrations"
DEFAULT_POOL_SIZE = 4
DEFAULT_POOL_TIMEOUT = 30.0
# While the database is known to be unreachable, wait this long for a pooled connection,
# not pool_timeout: callers back off and retry (checking their stop flags between tries),
# so a worker told to stop during an outage is never stuck for 30 s.
OUTAGE_WAIT = 0.5
# psycopg_pool retries a failed connect with its own backoff (1 s, doubling) for this long,
# then gives up and the next getconn starts a fresh attempt at once. Its default (300 s)
# let the delay grow past a minute during a long outage, so a host whose link came back
# stayed without connections; short, the callers' capped backoff (reconnect.py) decides.
POOL_RECONNECT_WINDOW = 2.0
CONNECT_TIMEOUT = 10
# libpq settings that bound how long a dead peer goes unnoticed; the URL may override them.
DEFAULT_TCP_USER_TIMEOUT_MS = 10_000
# Expired ledger days gc looks at per transaction: each is a subtransaction, and past 64
# in one transaction the server's per-session cache of them overflows (other sessions'
# snapshots then slow down until it ends). gc goes on in the next transaction.
LEDGER_DROP_DAYS = 32
_LIVENESS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": str(DEFAULT_TCP_USER_TIMEOUT_MS),
}
# URL options replayq reads itself; everything else (options, sslmode, …) goes to libpq.
_REPLAYQ_OPTIONS = {"pool_size", "pool_timeout", "idle_in_transaction_timeout"}
# Seconds a session may sit idle inside a transaction before the server ends it. A worker
# frozen mid-commit (SIGSTOP, a paused VM) holds its job row FOR SHARE (fencing); without
# a bound the reaper would skip that row for as long as the process stays frozen.
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT = 10.0


# A ``%`` not followed by two hex digits: libpq refuses it ("invalid percent-encoded token").
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_postgres_url(url: str) -> tuple[str, dict[str, str]]:
    """``postgresql://…?pool_size=8&options=…`` → (libpq conninfo, replayq options).

    The parameters that are not replayq's go to libpq as written, never decoded and
    encoded again: libpq reads ``+`` as a plus sign, not a space, so a re-encoded
    ``options=-csearch_path%3Da%20-cstatement_timeout%3D5s`` set the search path to
    ``a+-cstatement_timeout=5s`` (another schema, without a word) and the timeout not at all.
    """
    parts = urlsplit(url)
    ours: dict[str, str] = {}
    theirs: list[str] = []
    given: set[str] = set()
    for pair in parts.query.split("&"):
        if not pair:
            continue
        raw_key, _, raw_value = pair.partition("=")
        key = unquote(raw_key)
        if key in _REPLAYQ_OPTIONS:
            ours[key] = unquote(raw_value)
        else:
            theirs.append(f"{_bare_for_libpq(raw_key)}={_bare_for_libpq(raw_value)}")
            given.add(key)
    theirs += [f"{k}={v}" for k, v in _LIVENESS.items() if k not in given]
    conninfo = urlunsplit(parts._replace(query="&".join(theirs)))
    return conninfo, ours


def _without_passwords(text: str, conninfo: str) -> str:
    """``text`` (libpq's error, which quotes a token of the URL it cannot parse: ``invalid
    percent-encoded token: "<the password>"``) with the URL's passwords, as written and
    decoded, shown as ``***``."""
    parts = urlsplit(conninfo)
    written = {parts.password or ""}
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        if unquote(key) == "password":
            written.add(value)
    secrets = {form for secret in written for form in (secret, unquote(secret))} - {""}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return mask_url_passwords(text)


def _bare_for_libpq(raw: str) -> str:
    """A query key or value as written, but for what libpq's URI parser refuses bare and a
    browser or a decoder takes as meant: an ``=`` inside a value (``options=-csearch_path=a``),
    a space, a ``%`` that starts no ``%XX``. Each is percent-encoded (before, the whole query
    was, and such URLs worked; passed bare, the connection was refused: exit 3)."""
    return _LONE_PERCENT.sub("%25", raw).replace("=", "%3D").replace(" ", "%20")


# The compare-and-sets a ``pipelined(refusals=True)`` block sends without reading their
# row count (``PostgresTransaction.changed``, ``idem_transition``, ``branch_head_put``,
# the one sender of ``entity_head_put``): each as the statement under another name that
# refuses in the server (``rq_require``, migration 0027; SQLSTATE RQ001) unless it
# changed exactly one row (``refusing_queries``).
_REFUSING = {
    name: f"{name}_refusing"
    for name in (
        "entity_head_insert",
        "entity_head_cas",
        "entity_head_put",
        "idem_claim",
        "idem_succeed",
        "lock_release_in_time",
    )
}
# The SQLSTATE class of rq_require's refusals (RQ001: no row changed; RQ002: the lease
# is not held, ``trace_append_indexed``; RQ003: a lock's fencing token moved past a
# write's, ``lock_fence_refusing``).
_REFUSAL_CLASS = "RQ"


def refusing_queries(queries: Mapping[str, str]) -> dict[str, str]:
    """``_REFUSING``'s statements, made from the named ``queries`` they refuse for: the
    statement in a ``WITH`` (``RETURNING 1`` added if it returns nothing), its rows
    counted by ``rq_require``. The statement's name is the refusal's message, and its
    first line a comment naming it (the server's logs and ``pg_stat_statements``)."""
    made = {}
    for name, refusing in _REFUSING.items():
        statement = queries[name].strip().rstrip(";")
        if "RETURNING" not in statement.upper():
            statement += "\nRETURNING 1"
        made[refusing] = (
            f"-- {refusing}\nWITH changed AS (\n{statement}\n)\n"
            f"SELECT rq_require(count(*) = 1, 'RQ001', '{name}: no row changed') FROM changed"
        )
    return made


def _first_error(exc: psycopg.Error) -> psycopg.Error:
    """The error of the statement that failed in a pipeline, where psycopg raised the
    ``PipelineAborted`` of one after it instead: leaving the pipeline, psycopg processes
    the results that came in while it sent the ``Sync`` (the failed statement's error,
    raised), then, in a ``finally``, those still to come, and the ``COMMIT``'s abort
    raised there replaces the error (which it keeps as its ``__context__``). Seen for a
    few refusals in a hundred of a one-round-trip commit (``CommitRefused``; more under
    load), and the same for any failing statement sent unread (``send``): the real
    error, not an outage."""
    while isinstance(exc, psycopg.errors.PipelineAborted) and isinstance(
        exc.__context__, psycopg.Error
    ):
        exc = exc.__context__
    return exc


def _looks_dead(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle pooled connection was ended by the server while it sat in the pool.

    A session ended by ``pg_terminate_backend`` or a restart leaves a FATAL message
    and EOF on the socket, and an idle connection otherwise has nothing to read:
    one ``select``, no round trip. (Not the pool's ``check`` hook: after a failed
    check psycopg_pool sleeps about a second before trying the next connection.)
    """
    if conn.closed:
        return True
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    return bool(readable)


def _positive(url: str, options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigurationError(f"{url!r}: {name} must be a positive number, got {raw!r}")
    return value


def _read_only(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is SQLSTATE 25006: a write refused as read-only."""
    return isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) or isinstance(
        exc.__cause__, psycopg.errors.ReadOnlySqlTransaction
    )


def storage_error(what: str, exc: psycopg.Error, *, read_only_asked: bool = False) -> StorageError:
    """The replayq error for a driver error: unreachable server vs. anything else.

    A write refused because the session is read-only (SQLSTATE 25006) is the server
    being unable to take writes — a standby after a failover, or
    ``default_transaction_read_only`` — unless replayq itself asked for a read-only
    transaction (then it is a bug, and retrying would never end).

    Every message tells the driver error by ``server_message``: the server's primary
    message and SQLSTATE, never its DETAIL, HINT or CONTEXT lines, which quote row values
    (an application's data) and would go on into a job's trace (a handler's failure).
    The driver error itself stays the ``__cause__``.
    """
    said = server_message(exc)
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) and not read_only_asked:
        return DatabaseUnavailableError(
            f"{what}: the server takes no writes now (read-only, SQLSTATE 25006: a standby "
            f"after a failover?): {said}"
        )
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        # SQLSTATE 55P03: a row lock not granted within ``lock_timeout`` (or ``NOWAIT``).
        # Still an outage to whoever did not ask for the bound (a subclass); the session
        # is fine and its transaction rolled back.
        return RowLockTimeoutError(f"{what}: a lock was not granted in time: {said}")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        # SQLSTATE 57014: the server cancelled the statement (a ``statement_timeout`` of the
        # role or database, an operator's ``pg_cancel_backend``). The transaction rolled
        # back, the session is fine, and the same statement may well pass in a moment:
        # waited out like a server-wide ``lock_timeout``, never a job's failure (as a
        # plain ``StorageError`` it sent the job to ``dead``, class ``unknown``).
        return StatementCancelledError(f"{what}: the server cancelled the statement: {said}")
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailableError(f"{what}: {said}")
    if (exc.sqlstate or "").startswith("23"):
        # SQLSTATE class 23 (a unique key, a foreign key, a check, a not-null column): a
        # refusal the same write meets again.
        return ConstraintViolationError(
            f"{what}: {said}",
            table=exc.diag.table_name,
            constraint=exc.diag.constraint_name,
        )
    if isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout):
        # SQLSTATE 25P03 (class 25, so psycopg's InternalError, not OperationalError): the
        # server ended a session frozen inside a transaction (idle_in_transaction_timeout)
        # and rolled it back, as a killed session. Not the job's failure: retried.
        return DatabaseUnavailableError(f"{what}: the server ended the session: {said}")
    return StorageError(f"{what}: {said}")


# The objects a server error names in its diagnostics, as ``server_message`` says them:
# names from the schema, never values.
_NAMED = (
    ("constraint", "constraint_name"),
    ("table", "table_name"),
    ("column", "column_name"),
    ("type", "datatype_name"),
)


def server_message(exc: psycopg.Error) -> str:
    """What replayq says of a driver error: for one the server sent, its primary message
    and SQLSTATE, with the constraint, table, column or data type its diagnostics name
    (``new row for relation "t" violates check constraint "t_x_check" (SQLSTATE 23514;
    constraint t_x_check, table t)``).

    Not psycopg's ``str(exc)``, which appends the server's DETAIL, HINT and CONTEXT lines:
    a refused row's values (``Failing row contains (…)``), the key of a unique or foreign
    key, a trigger's ``RAISE … USING DETAIL``, a statement's text with its literals. An
    error the server did not send (no SQLSTATE: a connection refused, psycopg's own) is
    its text, which holds no row's values."""
    sqlstate = exc.sqlstate
    if not sqlstate:
        return str(exc)
    diag = exc.diag
    primary = diag.message_primary or str(exc).partition("\n")[0]
    where = [f"{label} {value}" for label, field in _NAMED if (value := getattr(diag, field))]
    named = f"; {', '.join(where)}" if where else ""
    return f"{primary} (SQLSTATE {sqlstate}{named})"


_JOB_INSERT_FIELDS = JobInsert.__struct_fields__
# The columns of a pack row (``packs.pack_row``) besides its job id, which the insert gives.
_PACK_FIELDS = ("trace_id", "attempt", "worker_id", "hlc", "hlc_last", "ts", "events")
# The column types of job_enqueue_copy and trace_pack_copy (binary COPY sends no names).
# fmt: off
_JOB_COPY_TYPES = [
    "int8", "text", "text", "text", "text", "int4", "float8", "float8", "int4",  # ..max_attempts
    "text", "text", "text", "text", "int8", "text", "text", "text", "text",  # ..trace_context
]
_PACK_COPY_TYPES = ["int8", "text", "int8", "int4", "text", "int8", "int8", "float8", "text"]
# fmt: on


_ts = operator.itemgetter("ts")


def _json_rows(rows: list[dict[str, Any]]) -> str:
    """Pack rows as JSON text for ``json_to_recordset``: numbers in their shortest exact
    form (a float8 reads back equal), text as is (a JSON text holds no raw NUL, the one
    character PostgreSQL's JSON cannot give back as text).

    With the [fast] extra orjson writes it (``codec.stored_text``) while every row's
    ``ts`` (a pack row's one float) is finite: orjson writes NaN and infinity as ``null``
    where the standard encoder refuses them. Its text may differ from the standard
    encoder's (``1e-05`` is its ``0.00001``), never the values the server reads from it.
    What orjson refuses (a lone surrogate, an integer beyond 64 bits) goes to the standard
    encoder as before."""
    try:
        finite = math.isfinite(sum(map(_ts, rows)))
    except (TypeError, KeyError):
        finite = False
    text = codec.stored_text(rows) if finite else None
    if text is not None:
        return text
    return json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# Each pooled connection's cursors, made once: a cursor's creation (its adapters' copy)
# was ~24 k instructions, one every transaction. A cursor outlives its transactions: each
# statement replaces its results, and a connection is used by one thread at a time.
_CURSORS: weakref.WeakKeyDictionary[
    psycopg.Connection[Any], tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]]
] = weakref.WeakKeyDictionary()


def _cursors_of(
    conn: psycopg.Connection[Any],
) -> tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]]:
    """``conn``'s two cursors (a transaction's statements, and a pipelined statement read
    after another), made on its first transaction."""
    cursors = _CURSORS.get(conn)
    if cursors is None or cursors[0].closed:
        cursors = _CURSORS[conn] = (conn.cursor(), conn.cursor())
    return cursors


def _queue_command(conn: psycopg.Connection[Any], command: bytes) -> None:
    """``command`` (``BEGIN``, ``COMMIT``) queued in ``conn``'s pipeline, sent with what
    follows it: psycopg's own way for its commands there (``_exec_command``, pinned in
    requirements.lock), which does not go through a cursor's execute, a wait and a send
    of its own each (~40 k instructions each, a group commit's third of the pipeline's
    cost). A psycopg without it: a statement on a cursor, as any other."""
    queued = getattr(conn, "_exec_command", None)
    if queued is None:
        conn.cursor().execute(command, prepare=False)
        return
    for _ in queued(command):  # in a pipeline it only queues: nothing to wait for
        pass


def _autocommit_off(conn: psycopg.Connection[Any]) -> None:
    """A connection ``pipelined`` set to autocommit mode, back out of it: its transaction
    rolled back if still open (the block failed), else closed (the pool drops it)."""
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.autocommit = False
    except Exception:
        conn.close()


class PostgresTransaction(SqlTransaction):
    """``SqlTransaction`` where PostgreSQL differs: arrays, driver errors, one-statement claims."""

    # Packs stay JSON text here: the rq_events view and every query read them with
    # PostgreSQL's own JSON functions, and TOAST compresses rows past ~2 KB.
    pack_format = packs.FORMAT_JSON

    @classmethod
    def pooled(
        cls, connection: psycopg.Connection[Any], queries: Mapping[str, str]
    ) -> PostgresTransaction:
        """The verbs on a pooled connection's transaction, every statement on one cursor.

        psycopg's ``connection.execute`` makes a cursor, and its adapters map, for each
        statement; every verb reads a statement's result before it runs the next, so one
        cursor serves the transaction. A caller's connection (``adopt``) keeps a cursor per
        statement: its driver may not be psycopg's."""
        tx = cls(connection, queries)
        tx.statements, tx._second = _cursors_of(connection)
        tx._pooled = True
        return tx

    # Whether this transaction is replayq's own on a pooled connection (``pooled``): only
    # then may ``pipelined`` commit it.
    _pooled = False
    # psycopg's pipeline while a ``pipelined`` block runs, else None.
    _pipeline: psycopg.Pipeline | None = None
    # The statements ``send`` sent in the pipeline since its last wait (their errors are
    # raised by the next statement that waits: its error names them too).
    _unread: tuple[str, ...] = ()
    # The pooled connection's second cursor (``_cursors_of``): ``jobs_complete_sent``'s.
    _second: psycopg.Cursor[Any] | None = None
    # Whether the ``pipelined`` block running was asked for ``refusals``.
    _refusing = False

    @contextmanager
    def pipelined(self, *, refusals: bool = False) -> Iterator[None]:
        """The end of this transaction in psycopg's pipeline mode, committed at the end
        of the block (``protocol.Transaction.pipelined``).

        Each statement is sent as it is made; a verb that reads its result ends it with
        a ``Sync`` and waits (``execute``, ``rows_executed``), so that every result it
        reads (``rowcount`` too, which pipeline mode leaves unset until then) is there,
        and an error is raised by the statement that made it. Not waited for:
        ``jobs_complete_sent``'s, read when the group commit asks (by then its lease
        brought it); a ``trace_append``'s new packs when they name no resource
        (``_packs_inserted``), whose ids nothing reads; and what ``send`` and
        ``send_many`` send (a blob, an entity's version row, the resource index), whose
        results nobody reads: their errors are raised by the next statement that waits,
        named with it (``_failed``). ``COMMIT`` is queued after them
        (``_queue_command``), and the pipeline's closing ``Sync`` brings all their
        results: an error in any of them fails the block (``StorageError``) and nothing
        commits.

        psycopg's own ``BEGIN`` in pipeline mode is followed by a ``Sync`` it waits for, a
        round trip of its own. With nothing sent yet in the transaction, ``BEGIN`` is
        queued too, sent with the next statement: for the block the connection is in
        autocommit mode (psycopg sends no ``BEGIN`` of its own), and it is set back
        after, the transaction rolled back first if the block failed; a connection that
        cannot be set back is closed, never returned to the pool in autocommit mode.

        A group commit is so ``BEGIN``, its compare-and-set and its lease in one round
        trip, its trace insert and ``COMMIT`` in a second: five round trips before. The
        pipeline costs client instructions of its own (psycopg's Python around each
        statement, a ``poll`` before each send): with cursors made once per connection
        (``_cursors_of``), a drain's worker runs ~2 % more instructions a job than
        with five round trips, and waits three times less a group.

        With ``refusals`` (``commit_at_once``) the compare-and-sets of an entity's head
        and of an effect's claim and success (``changed``, ``idem_transition``), the fence
        of a write under a lock (``lock_list``) and the block's fenced trace append
        (``trace_append``) are sent unread too, as statements that refuse in the server
        (``rq_require``: SQLSTATE class RQ) when they change no row, find the lock's
        fencing token moved on or the lease gone. A step's commit is then one round
        trip: ``BEGIN``, its statements and ``COMMIT`` behind one ``Sync``. A refusal
        aborts the transaction, nothing commits, and the block raises ``CommitRefused``
        for the caller to run it again without refusals.
        """
        conn = self.connection
        if not self._pooled or conn.autocommit or self._pipeline is not None:
            yield
            return
        own_begin = (
            conn.info.transaction_status == pq.TransactionStatus.IDLE
            and conn.isolation_level is None
            and conn.read_only is None
            and conn.deferrable is None
        )
        if own_begin:
            conn.autocommit = True
        try:
            with conn.pipeline() as pipeline:
                self._pipeline = pipeline
                self._refusing = refusals
                try:
                    if own_begin:
                        _queue_command(conn, b"BEGIN")
                    try:
                        yield
                    except CommitRefused:
                        # The refusal came in before the block's end (raised by a
                        # statement sent after the refusing one): the pipeline is aborted
                        # up to its Sync, read here, or psycopg's exit would read it and
                        # log "error ignored terminating" (a WARNING) for a refusal.
                        with contextlib.suppress(psycopg.Error):
                            pipeline.sync()
                        raise
                    _queue_command(conn, b"COMMIT")
                finally:
                    self._pipeline = None
        except psycopg.Error as exc:
            raise self._error("transaction", exc, "PostgreSQL ") from exc
        finally:
            self._unread = ()
            self._refusing = False
            if own_begin:
                _autocommit_off(conn)

    def _waited(self, cursor: Any) -> Any:
        """``cursor`` once its statement's result is in: in a pipeline, after a ``Sync``."""
        if self._pipeline is not None:
            self._pipeline.sync()
            self._unread = ()
        return cursor

    def _error(self, name: str, exc: psycopg.Error, what: str = "query ") -> Exception:
        """What ``exc``, raised when ``name`` ran or waited, is to the caller: in a
        ``refusals`` block a refusal of ``rq_require``'s is ``CommitRefused``; anything
        else a ``StorageError`` (``storage_error``) naming what failed (``_failed``)."""
        failed = self._failed(name, what)
        exc = _first_error(exc)
        if self._refusing and (exc.sqlstate or "").startswith(_REFUSAL_CLASS):
            return CommitRefused(f"{failed}: {server_message(exc)}")
        return storage_error(failed, exc, read_only_asked=bool(self.connection.read_only))

    def _failed(self, name: str, what: str = "query ") -> str:
        """What failed when ``name`` raised: in a pipeline, maybe a statement sent before it
        and not waited for (``send``)."""
        unread, self._unread = self._unread, ()
        if not unread:
            return f"{what}{name} failed"
        return f"{what}{name} (or {', '.join(unread)}, sent before it unread) failed"

    def rows_executed(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> list[Any]:
        try:
            return [
                self._waited(cursor)
                for cursor in super().rows_executed(name, columns, rows, params)
            ]
        except psycopg.Error as exc:
            raise self._error(name, exc) from exc

    def jobs_complete_sent(self, params: JobsComplete) -> Callable[[], set[int]]:
        """``jobs_complete``; in a ``pipelined`` block sent on a cursor of its own and not
        waited for: the next statement that waits (the lease) brings its result too."""
        pipeline = self._pipeline
        if pipeline is None:
            return super().jobs_complete_sent(params)
        sql, values = self.rows_query(
            "jobs_complete", JOBS_COMPLETE_COLUMNS, params.jobs, {"now": params.now}
        )
        cursor = self._second or self.connection.cursor()
        try:
            cursor.execute(sql, values)
        except psycopg.Error as exc:
            raise storage_error("query jobs_complete failed", exc) from exc

        def held() -> set[int]:
            try:
                if cursor.pgresult is None:  # nothing waited since: wait for it now
                    self._waited(None)
                rows = cursor.fetchall()
            except psycopg.Error as exc:
                raise storage_error(self._failed("jobs_complete"), exc) from exc
            return self.completed(rows)

        return held

    def list_param(self, values: Sequence[str] | Sequence[int] | None) -> Any:
        """A Python list, bound as an array for ``= ANY(%(x)s::text[])`` (or ``bigint[]``)."""
        return None if values is None else list(values)

    # -- the ledger tier in day partitions (migration 0013, docs/operations.md) ------------

    ledger_partitioned = True

    def _ledger_partitions(self, change: LedgerPartitions) -> int:
        made = 0
        for expires_at in change.expires_at:
            made += bool(self.fetchone("ledger_partition", {"expires_at": expires_at})["made"])
        return made

    def _ledger_drop(self, change: LedgerDrop) -> LedgerDropped:
        values = {"now": change.now, "after": change.after, "max_days": LEDGER_DROP_DAYS}
        row = self.fetchone("ledger_drop", values)
        return LedgerDropped(int(row["dropped"]), list(row["kept"]), row["last"])

    def _ledger_move(
        self, moved: Sequence[tuple[Mapping[str, Any], list[TraceEvent], float]]
    ) -> None:
        rows: list[dict[str, Any]] = []
        entries: list[dict[str, Any]] = []
        for row, events, expires_at in moved:
            pack_id = int(row["id"])
            rows.append({**self.pack_row(events), "id": pack_id, "expires_at": expires_at})
            entries.extend(
                {**entry, "expires_at": expires_at}
                for entry in packs.pack_resources(events, pack_id)
            )
        self.executemany("ledger_pack_insert", rows)
        if entries:
            self.executemany("ledger_resources_append", entries)

    def _unmove(self, job_id: int) -> None:
        # keep_transition locked the job's row FOR SHARE first, as a hold does: gc's batch
        # (FOR UPDATE SKIP LOCKED) committed before, or skips the job and then sees the pin.
        self.execute("ledger_unmove", {"job_id": job_id})

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        """Every row and every inserted row's first pack (its ``job.enqueued``): copied
        when no job names a message id (``_job_enqueue_copied``), else in one statement
        (``job_enqueue``), duplicates looked up after."""
        if not params:
            return []
        if len(params) == 1:
            return [self._job_enqueue_one(params[0], enqueued_event(params[0]))]
        events = [enqueued_event(p) for p in params]
        # The caller's connection (conn=) too, when it is psycopg's own (not async).
        driver = self.connection.raw if isinstance(self.connection, TupleRows) else self.connection
        if isinstance(driver, psycopg.Connection) and all(p.message_id is None for p in params):
            return self._job_enqueue_copied(driver, params, events)
        return self._job_enqueue_unnested(params, events)

    def _job_enqueue_unnested(
        self, params: Sequence[JobInsert], events: Sequence[TraceEvent]
    ) -> list[tuple[int, bool]]:
        """``job_enqueue`` as one ``INSERT … SELECT FROM unnest(…)`` (``job_enqueue``): for
        jobs with message ids (its ``ON CONFLICT`` skips duplicates) and for a caller's
        connection that is not psycopg's synchronous one."""
        values = {name: [getattr(p, name) for p in params] for name in _JOB_INSERT_FIELDS}
        rows = [self.pack_row([event]) for event in events]
        for column in _PACK_FIELDS:
            values[f"pack_{column}"] = [row[column] for row in rows]
        found = self.fetchall("job_enqueue", values)
        inserted = {row["trace_id"]: (int(row["id"]), int(row["pack_id"])) for row in found}
        result: list[tuple[int, bool]] = []
        written: list[TraceEvent] = []
        pack_ids: dict[int, int] = {}
        for p, event in zip(params, events, strict=True):
            ids = inserted.get(p.trace_id)
            if ids is None:
                existing = self.fetchone(
                    "job_by_message_id", {"job_type": p.job_type, "message_id": p.message_id}
                )
                result.append((int(existing["id"]), False))
                continue
            job_id, pack_ids[job_id] = ids
            result.append((job_id, True))
            written.append(with_job_id(event, job_id))
        if written:
            self._placed(written, pack_ids)
        return result

    def _job_enqueue_copied(
        self,
        driver: psycopg.Connection[Any],
        params: Sequence[JobInsert],
        events: Sequence[TraceEvent],
    ) -> list[tuple[int, bool]]:
        """``job_enqueue`` of jobs that name no message id, so none can be a duplicate:
        their ids and wake-ups in one statement (``job_enqueue_ids``), then the rows and
        the packs each as one binary ``COPY``.

        ``COPY`` skips what ``INSERT … SELECT FROM unnest(…)`` pays per row (an array
        element per column to encode and decode, the conflict check, the join that gives
        each pack its job id); at 3,000 jobs it takes about a third less time.
        """
        woke = sorted({p.queue for p in params if p.run_at <= p.now})
        ids = self.execute("job_enqueue_ids", {"count": len(params), "woke_queues": woke})
        placed = [(int(job_id), int(pack_id)) for job_id, pack_id in ids.fetchall()]
        cursor = driver.cursor()
        # Each pack is encoded while the server takes in the job rows already sent.
        pack_rows = []
        try:
            with cursor.copy(self._queries["job_enqueue_copy"]) as copy:
                copy.set_types(_JOB_COPY_TYPES)
                write = copy.write_row
                for (job_id, pack_id), p, event in zip(placed, params, events, strict=True):
                    write(
                        (
                            job_id, p.job_type, p.queue, p.payload_json, "queued", p.priority,
                            p.run_at, p.now, p.max_attempts, p.trace_id, p.ordering_key,
                            p.idempotency_key, p.handler_version, p.hlc, p.correlation_id,
                            p.causation_id, p.origin, p.trace_context,
                        )
                    )  # fmt: skip
                    row = self.pack_row([event])
                    pack_rows.append(
                        (
                            pack_id, row["trace_id"], job_id, row["attempt"], row["worker_id"],
                            row["hlc"], row["hlc_last"], row["ts"], row["events"],
                        )
                    )  # fmt: skip
            with cursor.copy(self._queries["trace_pack_copy"]) as copy:
                copy.set_types(_PACK_COPY_TYPES)
                for pack_row in pack_rows:
                    copy.write_row(pack_row)
        except psycopg.Error as exc:
            raise storage_error("copying the enqueued jobs failed", exc) from exc
        # Only what _placed reads: the events naming a resource, and the last.
        last = len(events) - 1
        self._placed(
            [
                with_job_id(event, placed[i][0])
                for i, event in enumerate(events)
                if event.resource is not None or i == last
            ],
            dict(placed),
        )
        return [(job_id, True) for job_id, _ in placed]

    def _job_enqueue_one(self, params: JobInsert, event: TraceEvent) -> tuple[int, bool]:
        """The row and its pack in one statement; on a duplicate message id, the job that
        has it (``existing_or_inserted``: each statement sees what committed before it, so
        that job may be gone by the read, and the insert is tried again)."""
        values = query_params(params)
        row = self.pack_row([event])
        for column in _PACK_FIELDS:
            values[f"pack_{column}"] = row[column]

        def insert() -> int | None:
            found = self.execute("job_enqueue_one", values).fetchone()
            if found is None:
                return None
            job_id = int(found[0])
            self._placed([with_job_id(event, job_id)], {job_id: int(found[1])})
            return job_id

        job_id = insert()
        if job_id is not None:
            return job_id, True
        return self.existing_or_inserted(params, insert)

    def _packs_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[dict[str, Any]]:
        """New packs; in a ``pipelined`` block, when none of their events names a resource
        (a group commit's ``job.succeeded`` and ``job.leased``), sent with the ``COMMIT``
        and not waited for: nothing reads their ids (no index entries; nothing joins them,
        the block ends with the commit). Their insert's error fails the commit."""
        if self._pipeline is None or any(e.resource is not None for g in groups for e in g):
            return super()._packs_inserted(groups)
        # Never read: sent with the COMMIT after it (``send``, in the block).
        self.send("trace_append_rows", {"rows": _json_rows(self._pack_rows(groups))})
        self._last_pack = None  # its id is not read: later events start a pack of their own
        return []

    def _pack_rows_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[int]:
        """``trace_append_rows``: one statement, the rows one JSON text; the new ids read
        off the result's tuples (``rows_inserted_ids``), no dictionary per pack."""
        rows = self._pack_rows(groups)
        found = self.execute("trace_append_rows", {"rows": _json_rows(rows)})
        return self.rows_inserted_ids(found, len(rows))

    def _pack_rows(self, groups: Sequence[Sequence[TraceEvent]]) -> list[dict[str, Any]]:
        """A new pack's row for each group (``pack_row`` without its call per pack; its
        rows hold just ``PACK_COLUMNS``, no copy of each), the last one's writer kept for
        later events to join, as ``pack_row`` keeps it."""
        rows = []
        opened, pack_format = packs.opened_row, self.pack_format
        for group in groups:
            row, self._writer = opened(group, pack_format)
            rows.append(row)
        return rows

    def rows_param(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """An array per column, for ``unnest``: in a join (``jobs_complete``,
        ``leases_extend``) the planner knows an array parameter's length and looks each
        row up by id; a JSON recordset's it guesses (100), and it would hash all the
        running jobs instead (see ``trace_append_rows``, an insert, for the JSON form).
        Each array as its literal (``arrays_as_literals``): ``rows_executed`` runs the
        statement on the cursor, past ``execute``, and a group commit's four arrays
        went through psycopg's list dumper."""
        arrays = {column: [row[i] for row in rows] for i, column in enumerate(columns)}
        return dict(arrays_as_literals(arrays))

    def columns(self, cursor: Any) -> list[str]:
        return column_names(cursor)

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        try:
            return self._waited(
                super().execute(name, arrays_as_literals(params) if params else params)
            )
        except psycopg.Error as exc:
            raise self._error(name, exc) from exc

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        try:
            super().executemany(name, rows)
            self._waited(None)
        except psycopg.Error as exc:
            raise self._error(name, exc) from exc

    def send(self, name: str, params: Mapping[str, Any], *, nullable: bool = False) -> None:
        """``SqlStatements.send``: in a ``pipelined`` block, sent on the transaction's
        cursor and not waited for (the next statement that waits brings its result, and
        its error if it made one); elsewhere ``execute``."""
        if self._pipeline is None:
            self.execute(name, params)
            return
        try:
            self.statements.execute(self._queries[name], arrays_as_literals(params))
        except psycopg.Error as exc:
            raise self._error(name, exc) from exc
        self._unread += (name,)

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        """``SqlStatements.changed``; in a ``refusals`` block a compare-and-set of
        ``_REFUSING`` is sent unread as its refusing statement, and answers ``True``: had
        it changed nothing, the block fails (``CommitRefused``)."""
        refusing = _REFUSING.get(name) if self._refusing else None
        if refusing is None:
            return super().changed(name, params)
        self.send(refusing, params)
        return True

    def branch_head_put(self, head: dict[str, Any]) -> bool:
        """``ContextVerbs.branch_head_put``; in a ``refusals`` block one statement sent
        unread, the head not looked up first: ``entity_head_put``, which inserts it or, if
        the branch has one, moves it from ``expected_version``, and refuses unless it
        changed a row. A refusal's careful commit looks it up, as always."""
        if not self._refusing:
            return super().branch_head_put(head)
        self.send(_REFUSING["entity_head_put"], head)
        return True

    def lock_transition(self, change: LockChange) -> Any:
        """``ContextVerbs.lock_transition``; an acquisition with a ``wait`` bound sets
        ``lock_timeout`` for the rest of its transaction first (``SET LOCAL``: in a pipeline
        queued as psycopg queues ``BEGIN``, no cursor and no round trip of its own; else
        ``lock_wait_bound``, its parameterised form): a commit
        holding the lock's row ``FOR SHARE`` (``lock_fence``) — a worker frozen inside a
        one-round-trip commit holds it until it thaws or its session ends — no longer
        keeps the acquisition waiting past its ``wait`` (``RowLockTimeoutError``)."""
        if type(change) is LockAcquire and change.wait is not None:
            ms = lock_timeout_ms(change.wait)
            if self._pipeline is not None:
                # ``SET`` takes no parameters: what is formatted is an ``int`` of ours. A
                # statement on the cursor (``lock_wait_bound``) cost ~40-80 k instructions
                # an acquisition, this nothing measurable (callgrind).
                _queue_command(self.connection, b"SET LOCAL lock_timeout = %d" % ms)
            else:
                self.send("lock_wait_bound", {"lock_timeout": f"{ms}ms"})
        return super().lock_transition(change)

    def lock_list(self, query: LockFilter) -> list[Lock]:
        """``ContextVerbs.lock_list``; in a ``refusals`` block a write's fence (a lock's row
        asked ``newer_than`` its token) is sent unread (``lock_fence_refusing``) and
        answers none: had the token moved on, the block fails (RQ003)."""
        if self._refusing and query.resource is not None and query.newer_than is not None:
            self.send(
                "lock_fence_refusing",
                {"resource": query.resource, "fencing_token": query.newer_than},
            )
            return []
        return super().lock_list(query)

    def idem_transition(self, change: IdemChange) -> bool:
        """``ContextVerbs.idem_transition``; in a ``refusals`` block a claim is sent
        unread (``changed``): had the key a record already, the block fails."""
        if self._refusing and type(change) is IdemClaim:
            self.send(_REFUSING["idem_claim"], query_params(change))
            return True
        return super().idem_transition(change)

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """``TraceVerbs.trace_append``; in a ``refusals`` block, events that make one new
        pack are sent unread with their resources' index entries, one statement
        (``trace_append_indexed``), which refuses in the server (RQ002) if ``fence``'s
        lease is not held, and answer ``True``. Nothing joins that pack (its id is not
        read): the block's last append."""
        if not self._refusing or self._last_pack is not None:
            return super().trace_append(events, fence)
        cut = packs.cut(events)
        if len(cut) != 1:
            return super().trace_append(events, fence)
        row = self.pack_row(cut[0])
        entries = packs.pack_resources(cut[0], 0)
        row["resources"] = [entry["resource"] for entry in entries]
        row["resource_hlcs"] = [entry["hlc"] for entry in entries]
        row["fence_job_id"] = None if fence is None else fence.job_id
        row["fence_owner_token"] = None if fence is None else fence.owner_token
        self.send("trace_append_indexed", row)
        return True

    def send_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """``executemany``, in a ``pipelined`` block not waited for (``send``)."""
        if self._pipeline is None:
            self.executemany(name, rows)
            return
        try:
            SqlTransaction.executemany(self, name, rows)
        except psycopg.Error as exc:
            raise self._error(name, exc) from exc
        self._unread += (name,)

    def job_lease(self, params: JobLease) -> list[Job]:
        """Claim the whole batch in one statement (``job_lease_batch``).

        If the claim trips the one-running-per-key unique index (see the module
        docstring) only the claim is undone, and it is tried again with a fresh
        snapshot, which sees the job that won: after the transaction's earlier
        statements the claim runs in a savepoint; as its first statement it runs bare,
        and a collision rolls back the transaction, which holds nothing else yet. With
        ``collision_aborts`` (a worker's group commit, which can do its acks again) it
        runs bare after them too: a collision aborts the transaction and raises
        ``LeaseCollisionError``, and a savepoint's two round trips are saved.

        Never psycopg's ``connection.transaction()`` with no transaction open: that
        block is the outer transaction, and its end commits the claim alone. The
        lease would be taken before its ``job.leased`` is written, and kept if the
        rest of the transaction never commits (a worker killed in between).
        """
        query_params = {
            "now": params.now,
            "lease_now": lease_now(params.now, params.database_clock),
            "queues": self.list_param(params.queues),
            "job_types": self.list_param(params.job_types),
            "skip_ids": self.list_param(params.skip_ids),
            "limit": params.limit,
            "owner_token": params.owner_token,
            "worker_id": params.worker_id,
            "hlc": params.hlc,
            "default_lease_seconds": float(params.default_lease_seconds),
            "lease_for": codec.dumps({k: float(v) for k, v in params.lease_for.items()}),
            "version_for": codec.dumps(dict(params.version_for)),
        }
        first = self.connection.info.transaction_status == pq.TransactionStatus.IDLE
        for attempt in range(3):
            if attempt == 0 or first:  # (again after a rollback: it held until then)
                self._lease_plan()
            try:
                # ``jobs_of``: each row's values become the job's fields directly, one
                # dictionary a job (``fetchall`` and ``row_to_job`` made two).
                if first or params.collision_aborts:
                    jobs = self.jobs_of(self.execute("job_lease_batch", query_params))
                else:
                    with self.connection.transaction():  # a savepoint: a transaction is open
                        jobs = self.jobs_of(self.execute("job_lease_batch", query_params))
                break
            except StorageError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                    raise
                if not first and params.collision_aborts:
                    # No savepoint: the collision aborted the transaction, which its caller
                    # does again.
                    raise LeaseCollisionError(str(exc)) from exc.__cause__
                if attempt == 2:
                    raise
                if first:
                    self.connection.rollback()  # the claim was all this transaction held
                log.debug("lease collided on an ordering key; claiming again")
        # RETURNING gives no order; hand jobs out in the order they were chosen.
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return jobs

    def _lease_plan(self) -> None:
        """The claim walks the ready index in its order, never sorting every queued job
        (``job_lease_plan``). In a group commit's pipeline queued as ``BEGIN`` is
        (``_queue_command``: no round trip, and none of a statement's ~70 k client
        instructions a group); a lease alone waits for it, one round trip more."""
        if self._pipeline is not None:
            _queue_command(self.connection, self._queries["job_lease_plan"].encode())
        else:
            self.execute("job_lease_plan")


class Notifier:
    """A thread that ``LISTEN``s on its own connection and calls ``callback(queue)``.

    After every (re)connect it calls ``callback(None)``: notifications sent while it
    was disconnected are lost, so listeners should look for work. ``listening`` is
    set while the ``LISTEN`` is in place; ``connects`` counts successful LISTENs and
    ``backend_pid`` names the server session holding the current one.
    """

    def __init__(
        self,
        conninfo: str,
        queries: Mapping[str, str],
        callback: Callable[[str | None], None],
        *,
        health_check_seconds: float = 5.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.conninfo = conninfo
        self.listen_sql = queries["jobs_listen"]
        self.installation_sql = queries["jobs_listen_installation"]
        # The oid of the rq_jobs table this listener's wake-ups are about (``_listen_once``).
        self.installation: int | None = None
        self._installation_read = 0.0  # monotonic time it was last looked up (``_heard``)
        self.health_sql = queries["listen_health"]
        self.callback = callback
        self.health_check_seconds = health_check_seconds
        self.max_backoff = max_backoff
        self.listening = threading.Event()
        self.connects = 0
        self.backend_pid: int | None = None
        self._last_check = 0.0
        self._stop = threading.Event()
        # close() writes here to end the thread's wait on the socket at once.
        self._closing_r, self._closing_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="replayq-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            connects = self.connects
            try:
                self._listen_once()
            except psycopg.Error as exc:
                if self.connects > connects:
                    backoff = 0.05  # it did LISTEN: a new outage starts from the short delay
                log.warning("LISTEN connection lost (%s); reconnecting in %.2fs", exc, backoff)
            self.listening.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def _listen_once(self) -> None:
        with psycopg.connect(
            self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            conn.execute(self.listen_sql)
            found = conn.execute(self.installation_sql).fetchone()
            self.installation = None if found is None or found[0] is None else int(found[0])
            self._installation_read = time.monotonic()
            self.backend_pid = conn.info.backend_pid
            self.connects += 1
            self.listening.set()
            self.callback(None)
            while not self._stop.is_set():
                # Wait on the socket and on close()'s pipe together: closing never waits
                # out a timeout. Notifications libpq already read are drained each turn.
                # Read them all first: ``notifies`` holds the connection's lock while it
                # yields, and ``_heard`` may run a query on it.
                for payload in [notify.payload for notify in conn.notifies(timeout=0)]:
                    self._heard(payload, conn)
                readable, _, _ = select.select(
                    [conn.fileno(), self._closing_r], [], [], self.health_check_seconds
                )
                if self._stop.is_set():
                    return
                if not readable:
                    self._check_alive(conn)

    def _heard(self, payload: str, conn: psycopg.Connection[Any]) -> None:
        """A wake-up: ``[rq_jobs oid, queue]`` as JSON. Another installation's (a sibling
        schema's rq_jobs) is ignored; a payload of another form (a plain queue name, as
        replayq sent before) wakes the callback as it did.

        A wake-up for another table may be this installation's own under a new oid: its
        ``rq_jobs`` made again while this session lived (a ``pg_restore`` of the schema
        under running workers), which no reconnect tells. So the oid is looked up again,
        at most once a second (a busy sibling installation costs one query a second):
        with the old one kept, every wake-up was ignored and idle workers waited for their
        poll (``--poll-interval``), ``tests/acceptance/test_postgres_restore.py``.
        """
        try:
            installation, queue = json.loads(payload)
        except (ValueError, TypeError):
            self.callback(payload)
            return
        if self.installation is not None and installation != self.installation:
            now = time.monotonic()
            if now - self._installation_read < 1.0:
                return
            self._installation_read = now
            found = conn.execute(self.installation_sql).fetchone()
            self.installation = None if found is None or found[0] is None else int(found[0])
            if self.installation is not None and installation != self.installation:
                return
        self.callback(str(queue))

    def _check_alive(self, conn: psycopg.Connection[Any]) -> None:
        # A silent half-open socket (partitioned host) raises nothing on read; a cheap
        # round trip every health_check_seconds notices it.
        now = time.monotonic()
        if now - self._last_check >= self.health_check_seconds:
            self._last_check = now
            conn.execute(self.health_sql)

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening at once (the thread is woken); never blocks longer than ``timeout``."""
        self._stop.set()
        with contextlib.suppress(OSError):  # closed twice: the pipe is already gone
            os.write(self._closing_w, b"x")
        self._thread.join(timeout)
        if not self._thread.is_alive():
            for fd in (self._closing_r, self._closing_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _handing_over(first: psycopg.Connection[Any]) -> type[psycopg.Connection[Any]]:
    """The pool's connection class: its first ``connect`` returns ``first``, the connection
    already opened to check that the server answers; every later one connects anew."""
    spare = [first]

    class Handed(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
            with contextlib.suppress(IndexError):  # pop is atomic: one thread takes it
                return spare.pop()
            return super().connect(conninfo, **kwargs)

    return Handed


class PostgresStorage:
    """``Storage`` on a PostgreSQL database through a connection pool."""

    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        self.url = url
        self.conninfo, options = parse_postgres_url(url)
        self.pool_size = int(_positive(url, options, "pool_size", DEFAULT_POOL_SIZE))
        pool_timeout = _positive(url, options, "pool_timeout", DEFAULT_POOL_TIMEOUT)
        idle = _positive(
            url, options, "idle_in_transaction_timeout", DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT
        )
        self._idle_in_transaction_ms = str(int(idle * 1000))
        self.queries = load_queries("replayq.storage.postgres")
        self.queries.update(refusing_queries(self.queries))
        self._closed = False  # by ``close()``: every later use raises ``StorageError``
        self._where = f"PostgreSQL at {mask_url_passwords(self.conninfo)}"
        # Cleared when a call finds the database gone (a dead or broken connection), set
        # again by the next connection the pool opens: while clear, waits are short.
        self._reachable = threading.Event()
        self._reachable.set()
        try:
            # One direct connection first: the pool would retry quietly until its timeout,
            # and this gives the caller the server's own reason at once. It then becomes the
            # pool's first connection (``_handing_over``): opening a second one cost every
            # process's start a round of connection setup and the server a backend's start.
            first = psycopg.connect(self.conninfo, connect_timeout=CONNECT_TIMEOUT)
        except psycopg.Error as exc:
            said = _without_passwords(str(exc), self.conninfo)
            raise DatabaseUnavailableError(
                f"cannot connect to PostgreSQL at {mask_url_passwords(self.conninfo)}: {said}"
            ) from exc
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.conninfo,
            connection_class=_handing_over(first),
            min_size=1,
            max_size=self.pool_size,
            timeout=pool_timeout,
            kwargs={"autocommit": False, "connect_timeout": CONNECT_TIMEOUT},
            configure=self._connected,
            reconnect_timeout=POOL_RECONNECT_WINDOW,
            name="replayq",
            open=False,
        )
        try:
            self.pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except psycopg.Error as exc:
            self.pool.close()
            first.close()  # not taken by the pool (closing twice is harmless)
            said = _without_passwords(str(exc), self.conninfo)
            raise DatabaseUnavailableError(
                f"cannot connect to PostgreSQL at {mask_url_passwords(self.conninfo)}: {said}"
            ) from exc

    def _connected(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's ``configure`` hook: a new connection proves the server answers.

        It also bounds how long the session may sit idle inside a transaction, so a
        frozen worker's row locks are released by the server, not by the worker.
        """
        # In autocommit: one round trip, where BEGIN, the statement and COMMIT were three.
        conn.autocommit = True
        try:
            conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                (self._idle_in_transaction_ms,),
            )
        finally:
            conn.autocommit = False
        self._reachable.set()

    def _wait(self) -> float | None:
        """How long to wait for a pooled connection: ``pool_timeout`` unless in an outage."""
        return None if self._reachable.is_set() else OUTAGE_WAIT

    def _live_connection(self) -> psycopg.Connection[Any]:
        """A pooled connection, skipping (and closing) those the server already ended.

        In an outage (the last call found the database gone) it waits ``OUTAGE_WAIT``,
        not ``pool_timeout``, then raises ``PoolTimeout``: the caller's backoff retries,
        and a worker shutting down is never held by a dead database.
        """
        for _ in range(self.pool_size):
            conn = self.pool.getconn(self._wait())
            if not _looks_dead(conn):
                return conn
            self._reachable.clear()  # the server ended it: restart, kill, or failover
            conn.close()  # the pool drops a closed connection and opens a new one
            self.pool.putconn(conn)
        return self.pool.getconn(self._wait())

    @contextmanager
    def _connection(self, *, readonly: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction that commits on success, else rolls back."""
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._live_connection()
            try:
                with conn:  # commit on success, roll back on an exception
                    # Not ``False``: psycopg would BEGIN READ WRITE, which a standby refuses
                    # with another code (0A000) and which overrides a server told to take
                    # no writes; with the server's default a refused write is 25006.
                    # Set only when it changes: psycopg's setter checks the transaction
                    # status through its wait loop and forgets the cached BEGIN.
                    read_only = True if readonly else None
                    if conn.read_only is not read_only:
                        conn.read_only = read_only
                    yield conn
            except BaseException as exc:
                if not readonly and _read_only(exc):
                    # A read-only session (a standby after a failover): drop it, so that
                    # the pool's next connection can reach the primary that took over.
                    conn.close()
                raise
            finally:
                self.pool.putconn(conn)
        except psycopg.Error as exc:
            if self._closed:  # the pool's ``PoolClosed`` is no outage to wait out
                raise storage_closed(self._where) from exc
            raise storage_error(
                "PostgreSQL transaction failed", exc, read_only_asked=readonly
            ) from exc
        finally:
            # No connection to be had, or it broke under us: the database is gone for now.
            if conn is None or conn.broken or conn.closed:
                self._reachable.clear()
            elif not self._reachable.is_set():
                self._reachable.set()

    @contextmanager
    def transaction(self, *, readonly: bool = False) -> Iterator[PostgresTransaction]:
        with self._connection(readonly=readonly) as conn:
            yield PostgresTransaction.pooled(conn, self.queries)

    def snapshot_read(self) -> AbstractContextManager[PostgresTransaction]:
        """Reads each of its own snapshot (``protocol.SnapshotRead``): a pooled connection
        in autocommit mode, as ``autocommit``. A read that is one statement
        (``ctx.state.get`` of an entity on the main branch, ``entity_head_version``) is
        one round trip, not three (``BEGIN``, the statement, ``COMMIT``). Nothing is
        written through it."""
        return self.autocommit()

    @contextmanager
    def autocommit(self) -> Iterator[PostgresTransaction]:
        """Verbs on a pooled connection in autocommit mode: each statement is its own
        transaction (``protocol.Autocommit``); the connection goes back as it came."""
        with self._connection() as conn:
            conn.autocommit = True
            try:
                yield PostgresTransaction.pooled(conn, self.queries)
            finally:
                if not conn.closed:
                    conn.autocommit = False

    def adopt(self, connection: Any) -> PostgresTransaction:
        """Verbs on the caller's open transaction, whatever the connection's row factory.

        A psycopg connection (sync, or async seen through ``AsyncConnectionView``) is
        checked: not in a failed transaction, not in autocommit outside one. Any other
        DB-API connection (a framework's adapter) is trusted to be on this database
        inside the caller's transaction.
        """
        if self._closed:
            raise storage_closed(self._where)
        driver = connection.raw if isinstance(connection, AsyncConnectionView) else connection
        if isinstance(driver, psycopg.Connection | psycopg.AsyncConnection):
            status = driver.info.transaction_status
            if status == pq.TransactionStatus.INERROR:
                raise ConfigurationError(
                    "the connection's transaction has failed; roll it back before enqueueing"
                )
            if status != pq.TransactionStatus.INTRANS and driver.autocommit:
                raise ConfigurationError(
                    "transactional enqueue needs an open transaction: the connection is in "
                    "autocommit mode (use `with conn.transaction():` or autocommit=False)"
                )
        elif not callable(getattr(connection, "cursor", None)):
            raise ConfigurationError(
                f"transactional enqueue on PostgreSQL takes a psycopg connection (or another "
                f"DB-API connection to the same database), got {type(connection).__name__}"
            )
        return PostgresTransaction(TupleRows(connection), self.queries)

    def listen(self, callback: Callable[[str | None], None]) -> Notifier:
        """Call ``callback(queue)`` when a job becomes ready; ``close()`` the result to stop."""
        if self._closed:
            raise storage_closed(self._where)
        return Notifier(self.conninfo, self.queries, callback)

    def _applied(self, tx: PostgresTransaction) -> list[tuple[int, str, float]]:
        rows = tx.fetchall("migrations_applied")
        return [(int(r["version"]), str(r["name"]), float(r["applied_at"])) for r in rows]

    def migrate(self, now: float) -> list[MigrationStatus]:
        with self.transaction() as tx:
            tx.execute("migrations_lock")
            tx.execute("migrations_create")

            own = migrate.replayq_names_of(_MIGRATIONS)

            def run_script(script: str) -> None:
                try:
                    upgrade.run_migration(tx, script, own)
                except psycopg.Error as exc:
                    raise storage_error("migration failed", exc) from exc

            return migrate.apply_pending(
                _MIGRATIONS,
                self._applied(tx),
                run_script,
                lambda version, name: tx.execute(
                    "migration_record", {"version": version, "name": name, "now": now}
                ),
            )

    def migration_status(self) -> list[MigrationStatus]:
        # One statement in autocommit: a round trip, where BEGIN READ ONLY, a look for the
        # table and COMMIT made four at every process's start. A database never migrated
        # has no table (undefined table, nothing else changed): none applied.
        with self.autocommit() as tx:
            try:
                applied = self._applied(tx)
            except StorageError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                    raise
                applied = []
        return migrate.migration_status(applied, _MIGRATIONS)

    def connections(self) -> int:
        """The pool's open connections (a listener's dedicated one is not counted)."""
        return int(self.pool.get_stats().get("pool_size", 0))

    def close(self) -> None:
        """Close the pool; every later use raises ``StorageError`` (closed). A block open
        meanwhile keeps its connection to its end (up to 5 s), then the pool closes it."""
        self._closed = True
        self.pool.close(timeout=5.0)


# The optional capability the worker looks for, checked here by the type checker.
_LISTENER: type[Listener] = PostgresStorage
