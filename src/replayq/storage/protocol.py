"""The storage seam: a small protocol with noun-first verbs taking parameter structs.

Domain code (queue, worker, context, replay) talks to a ``Storage`` and the
``Transaction`` objects it hands out; it never sees a driver. Every verb that
depends on time takes ``now`` from the caller's ``Clock``. Backends live in
``storage/sqlite/`` and ``storage/postgres/`` and pass one conformance suite.

The verbs' signatures are declared by family, one protocol module each
(``job_protocol``, ``report_protocol``, ``trace_protocol``, ``rollout_protocol``,
``context_protocol``, ``retention_protocol``); ``Transaction`` composes them here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, runtime_checkable

from replayq.errors import StorageClosedError
from replayq.storage.context_params import (
    BlobPut,
    BranchCreate,
    CacheDelete,
    CacheLookup,
    CachePut,
    EntityFilter,
    EntityGet,
    IdemChange,
    IdemClaim,
    IdemCompensate,
    IdemFail,
    IdemFilter,
    IdemResolve,
    IdemSucceed,
    IdemTakeover,
    LineagePut,
    LockAcquire,
    LockFilter,
    OutboxInsert,
    OutboxMark,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleMade,
    ScheduleRegister,
    StepComplete,
    TraceFence,
)
from replayq.storage.context_protocol import ContextTransaction
from replayq.storage.job_protocol import JobTransaction
from replayq.storage.pack_dictionaries import PackDictionaries
from replayq.storage.params import (
    ComparisonPut,
    JobBury,
    JobCancel,
    JobCancelRequest,
    JobCancelRunning,
    JobChange,
    JobFilter,
    JobInsert,
    JobLease,
    JobMatch,
    JobRedeliver,
    JobReleaseRunning,
    JobRequeue,
    JobReroute,
    JobRetry,
    JobRoute,
    JobsComplete,
    JobSetRecorded,
    JobTrace,
    LeaseRelease,
    LeasesExtend,
    MigrationStatus,
    RoutingPut,
    TraceJobs,
    TraceQuery,
    TraceWindow,
)
from replayq.storage.records import (
    Blob,
    Branch,
    CacheRecord,
    Comparison,
    ContractRecord,
    EntityRecord,
    GcCandidate,
    IdemRecord,
    JobGauge,
    JobHour,
    KeepRecord,
    LineageRecord,
    Lock,
    LockGrant,
    OrderBreak,
    OutboxBacklog,
    OutboxRecord,
    RoutingEvent,
    RoutingRecord,
    ScheduleRecord,
    SignalBucket,
    StepRecord,
    VersionOutcome,
)
from replayq.storage.report_protocol import ReportTransaction
from replayq.storage.retention_params import GcScan
from replayq.storage.retention_protocol import RetentionTransaction
from replayq.storage.rollout_protocol import RolloutTransaction
from replayq.storage.trace_protocol import TraceTransaction

# The parameter structs and records named here are re-exported: callers import the seam
# from this one module.
__all__ = [
    "UNPIPELINED",
    "Blob",
    "BlobPut",
    "Branch",
    "BranchCreate",
    "CacheDelete",
    "CacheLookup",
    "CachePut",
    "CacheRecord",
    "Comparison",
    "ComparisonPut",
    "ContractRecord",
    "EntityFilter",
    "EntityGet",
    "EntityRecord",
    "GcCandidate",
    "GcScan",
    "IdemChange",
    "IdemClaim",
    "IdemCompensate",
    "IdemFail",
    "IdemFilter",
    "IdemRecord",
    "IdemResolve",
    "IdemSucceed",
    "IdemTakeover",
    "JobBury",
    "JobCancel",
    "JobCancelRequest",
    "JobCancelRunning",
    "JobChange",
    "JobFilter",
    "JobGauge",
    "JobHour",
    "JobInsert",
    "JobLease",
    "JobMatch",
    "JobRedeliver",
    "JobReleaseRunning",
    "JobRequeue",
    "JobReroute",
    "JobRetry",
    "JobRoute",
    "JobSetRecorded",
    "JobTrace",
    "JobsComplete",
    "KeepRecord",
    "LeaseRelease",
    "LeasesExtend",
    "LineagePut",
    "LineageRecord",
    "ListenHandle",
    "Listener",
    "Lock",
    "LockAcquire",
    "LockGrant",
    "MigrationStatus",
    "OrderBreak",
    "OutboxBacklog",
    "OutboxInsert",
    "OutboxMark",
    "OutboxRecord",
    "RoutingEvent",
    "RoutingPut",
    "RoutingRecord",
    "ScheduleAdvance",
    "ScheduleChange",
    "ScheduleMade",
    "ScheduleRecord",
    "ScheduleRegister",
    "SignalBucket",
    "StepComplete",
    "StepRecord",
    "Storage",
    "TraceFence",
    "TraceJobs",
    "TraceQuery",
    "TraceWindow",
    "Transaction",
    "VersionOutcome",
    "idem_get",
    "idem_judged",
    "iter_chunks",
    "lock_get",
]


# ``Transaction.pipelined`` where a transaction has no pipeline (SQLite, a caller's
# connection), and what a commit that must not be pipelined enters instead
# (``Recorder.commit_now``): one reusable no-op, no generator made for each commit.
UNPIPELINED: AbstractContextManager[None] = nullcontext()


class Transaction(
    JobTransaction,
    ReportTransaction,
    TraceTransaction,
    RolloutTransaction,
    ContextTransaction,
    RetentionTransaction,
    Protocol,
):
    """The verbs, all inside one database transaction. A verb taking a union declares an
    ``@overload`` per kind whose answer differs; implementations dispatch on the class.

    Composed of one protocol per verb family, each in the module beside the one that
    implements it: ``job_protocol`` and ``rollout_protocol`` (``sql_transaction``),
    ``report_protocol`` (``report_verbs``), ``trace_protocol`` (``trace_verbs``),
    ``context_protocol`` (``context_verbs``), ``retention_protocol`` (``retention_verbs``).
    """

    connection: Any
    """The driver connection the transaction runs on (for ``ctx.db_write``)."""


class ListenHandle(Protocol):
    """What ``Listener.listen`` returns: a running listener the caller closes."""

    listening: threading.Event

    def close(self, timeout: float = 2.0) -> None: ...


@runtime_checkable
class Listener(Protocol):
    """An optional capability: a backend that pushes wake-ups when jobs are enqueued.

    PostgreSQL has it (``LISTEN``/``NOTIFY``); SQLite too, by watching the file for
    commits (``sqlite/watch.py``). The worker checks with ``isinstance(storage,
    Listener)`` and polls when it is absent.
    """

    def listen(self, callback: Callable[[str | None], None]) -> ListenHandle:
        """Call ``callback(queue)`` on each notification until the notifier is closed."""
        ...


@runtime_checkable
class Autocommit(Protocol):
    """An optional capability: verbs each committed on their own, for a write that is one
    statement — one statement where ``transaction`` takes three (``BEGIN``, the
    statement, ``COMMIT``). Both backends have it for ``App.enqueue``, whose row and
    ``job.enqueued`` pack are one statement: one round trip on PostgreSQL, and on SQLite
    two statements fewer (the insert keeps the pack in the job's row, migration 0023).
    """

    def autocommit(self) -> AbstractContextManager[Transaction]:
        """A ``Transaction`` whose every statement commits (or fails) by itself."""
        ...


@runtime_checkable
class SnapshotRead(Protocol):
    """An optional capability: read verbs each reading a snapshot of their own, for a read
    that is one statement, without the ``BEGIN`` and ``COMMIT`` of a read-only
    ``transaction`` (SQLite, PostgreSQL in autocommit mode: the current version of an
    entity is one statement, ``entity_get``). Nothing is written through it."""

    def snapshot_read(self) -> AbstractContextManager[Transaction]:
        """A ``Transaction`` whose every statement reads a snapshot of its own."""
        ...


@runtime_checkable
class PackLearning(Protocol):
    """An optional capability: trace packs deflated against a dictionary learned for each
    job type from its own traces (SQLite; storage/pack_dictionaries.py). The worker tells
    it each attempt it starts (``attempt_starts``) and each success acked
    (``pack_dictionaries.succeeded``, in memory: an ack's transaction stays the ack's)."""

    pack_dictionaries: PackDictionaries

    def attempt_starts(self, job_id: int, job_type: str) -> None:
        """Job ``job_id`` (of ``job_type``) starts an attempt here: its new packs use the
        type's dictionary (read from the database at the type's first attempt here, or
        learned from two succeeded jobs of the type at the first attempt after them)."""
        ...


class Storage(Protocol):
    """A database that replayq keeps its queue, trace and state in."""

    url: str
    dialect: str

    def transaction(self, *, readonly: bool = False) -> AbstractContextManager[Transaction]:
        """A write transaction on this thread's connection; commits on success."""
        ...

    def adopt(self, connection: Any) -> Transaction:
        """Verbs on the caller's own open transaction; the caller commits or rolls back."""
        ...

    def migrate(self, now: float) -> list[MigrationStatus]:
        """Apply pending migrations; return what was applied."""
        ...

    def migration_status(self) -> list[MigrationStatus]: ...

    def connections(self) -> int:
        """Database connections this process holds open (a worker's resource-usage gauge)."""
        ...

    def close(self) -> None:
        """Close the storage's connections; every later use raises ``storage_closed``'s
        ``StorageError``, on every backend."""
        ...


def storage_closed(what: str) -> StorageClosedError:
    """The error of a storage used after its ``close()``: a ``StorageError``, not
    ``DatabaseUnavailableError`` (waiting would never make it usable again)."""
    return StorageClosedError(
        f"{what}: this storage is closed (its close() was called); open a new one"
    )


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Split ``items`` into slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def idem_get(tx: Transaction, key: str) -> IdemRecord | None:
    """The idempotency record of ``key``, if there is one."""
    found = tx.idem_list(IdemFilter(key=key))
    return found[0] if found else None


def idem_judged(
    tx: Transaction, key: str, now: float, *, database_clock: bool
) -> IdemRecord | None:
    """The idempotency record of ``key`` with ``in_doubt`` judged in the same read: a
    ``started`` record is in doubt unless its attempt still runs under a lease that has
    not ended (by ``now``, or the database's clock with ``database_clock``)."""
    found = tx.idem_list(IdemFilter(key=key, now=now, database_clock=database_clock))
    return found[0] if found else None


def lock_get(tx: Transaction, resource: str, now: float | None = None) -> Lock | None:
    """The lock row of ``resource`` (held or not), if there is one; ``expired`` judged in
    ``now``, or in the database's clock when ``None``."""
    found = tx.lock_list(LockFilter(resource=resource, now=now))
    return found[0] if found else None
