"""The storage seam: a small protocol with noun-first verbs taking parameter structs.

Domain code (queue, worker, context, replay) talks to a ``Storage`` and the
``Transaction`` objects it hands out; it never sees a driver. Every verb that
depends on time takes ``now`` from the caller's ``Clock``. Backends live in
``storage/sqlite/`` and ``storage/postgres/`` and pass one conformance suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, overload, runtime_checkable

from replayq.errors import StorageError
from replayq.model import Job, StatRow, TraceEvent
from replayq.storage.context_params import (
    BlobPut,
    BranchCreate,
    CacheChange,
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
    LineageQuery,
    LockAcquire,
    LockChange,
    LockFilter,
    LockRelease,
    LockReleaseInTime,
    LockRenew,
    OutboxChange,
    OutboxClaim,
    OutboxInsert,
    OutboxMark,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleMade,
    ScheduleRegister,
    StepComplete,
    TraceFence,
)
from replayq.storage.params import (
    ActiveVersion,
    ComparisonPut,
    ComparisonQuery,
    ContractActivate,
    ContractPut,
    ContractQuery,
    JobBury,
    JobCancel,
    JobCancelRequest,
    JobCancelRunning,
    JobChange,
    JobFilter,
    JobInsert,
    JobLease,
    JobMatch,
    JobQuery,
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
    RolloutChange,
    RolloutQuery,
    RoutingHistory,
    RoutingPut,
    RoutingQuery,
    TraceJobs,
    TraceQuery,
    TraceRead,
    TraceWindow,
)
from replayq.storage.records import (
    Blob,
    BlobCandidate,
    Branch,
    CacheRecord,
    Comparison,
    ContractRecord,
    DerivedCandidate,
    EntityRecord,
    GcAnswer,
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
from replayq.storage.reports import (
    JobCount,
    JobDurations,
    JobGauges,
    JobsScheduled,
    JobStats,
    OutboxPending,
    OutOfOrder,
    ReportQuery,
    SignalCounts,
    SignalSeries,
    VersionOutcomes,
)
from replayq.storage.retention_params import (
    BlobScan,
    DerivedScan,
    GcChange,
    GcCount,
    GcCursor,
    GcHighestId,
    GcQuery,
    GcScan,
    JobHours,
    KeepChange,
    KeptJobs,
    LedgerDrop,
    LedgerDropped,
)

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
    "iter_chunks",
    "lock_get",
]


# ``Transaction.pipelined`` where a transaction has no pipeline (SQLite, a caller's
# connection), and what a commit that must not be pipelined enters instead
# (``Recorder.commit_now``): one reusable no-op, no generator made for each commit.
UNPIPELINED: AbstractContextManager[None] = nullcontext()


class Transaction(Protocol):
    """The verbs, all inside one database transaction. A verb taking a union declares an
    ``@overload`` per kind whose answer differs; implementations dispatch on the class."""

    connection: Any
    """The driver connection the transaction runs on (for ``ctx.db_write``)."""

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        """Insert a job with its ``job.enqueued`` pack (``lifecycle_packs.enqueued_event``); on a
        duplicate ``message_id`` return ``(existing_id, False)`` and write nothing. Many
        jobs: ``job_enqueue``."""
        ...

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        """``job_insert`` of ``params`` (one pair each, in order): each row inserted with
        its ``job.enqueued`` event (``lifecycle_packs.enqueued_event``) as its first trace pack; a
        duplicate ``message_id`` writes neither. One statement for all of it on
        PostgreSQL; on SQLite one insert per job, which keeps the pack in the job's row
        (``rq_jobs.enqueued``, migration 0023; read through the view ``rq_packs``)."""
        ...

    def job_get(self, job_id: int) -> Job | None: ...

    def job_lease(self, params: JobLease) -> list[Job]:
        """Claim up to ``limit`` ready jobs, honouring priority, ``run_at`` and per-key FIFO."""
        ...

    def lease_check(self, job_id: int, owner_token: str) -> bool:
        """Whether ``owner_token`` holds the job's lease, kept so until this transaction ends.

        The fence of every write a job makes: a step's commit, an effect's claim and
        result. ``False`` once the lease was reaped or re-leased; on PostgreSQL the
        row is locked (``FOR SHARE``) so a concurrent reaper cannot interleave.
        """
        ...

    def lease_extend(self, params: LeasesExtend) -> set[int]:
        """Extend every lease of ``params`` in one statement; the ids of those still held
        (each row a compare-and-set on its own owner token)."""
        ...

    def jobs_complete(self, params: JobsComplete) -> set[int]:
        """Mark succeeded, in one statement, each running job whose owner token still holds
        it (a compare-and-set per row); the ids of those it marked."""
        ...

    def jobs_complete_sent(self, params: JobsComplete) -> Callable[[], set[int]]:
        """``jobs_complete``, its answer (the ids marked) given by the function returned.
        In a ``pipelined`` block on PostgreSQL the statement is sent and not waited for:
        it travels with the next statement that waits (a group commit's lease), and the
        function reads its result then (or waits for it). Call it before the block ends:
        an ack refused must roll the transaction back, never commit."""
        ...

    def pipelined(self, *, refusals: bool = False) -> AbstractContextManager[None]:
        """The end of this transaction: the statements in the block, then its commit.

        On a pooled PostgreSQL transaction the block runs in psycopg's pipeline mode and
        commits at its end, the statements not yet waited for (``jobs_complete_sent``,
        the new trace packs of a ``trace_append`` that index no resource, what ``send``
        and ``send_many`` sent) sent with the next that waits or with the ``COMMIT``; an
        error in any of them fails the commit (``StorageError``) and nothing commits.
        Every other verb in the block waits for its own result, as outside it; nothing
        but replayq's verbs may run in it (``Recorder.defer``'s ``pipelines``). An
        exception in the block rolls the transaction
        back. Nothing may follow the block in the transaction. Elsewhere (SQLite, a
        caller's connection) it changes nothing: the transaction commits when it ends.

        ``refusals``: the block's compare-and-sets (an entity's head, an effect's claim and
        success), the fences of its writes under a lock (``LockFilter.newer_than``) and
        its fenced trace append are not waited for either: each refuses in the server
        when it changes no row, finds the lock's fencing token moved on or the lease
        gone, so the whole block is one round trip. They answer as if they had changed
        their row (``True``) or found the token where it was (no lock newer), and
        a refusal fails the block with ``CommitRefused`` (nothing committed): the caller
        runs it again without ``refusals`` (``commit_at_once``, ``storage/commits.py``),
        where each answer is read and says what happened. The block's last trace append
        must be its last statement of the trace (nothing joins its pack). Elsewhere it
        changes nothing."""
        ...

    @overload
    def job_transition(self, change: JobChange) -> bool: ...

    @overload
    def job_transition(self, change: JobReroute) -> int: ...

    def job_transition(self, change: JobChange | JobReroute) -> bool | int:
        """Apply one compare-and-set to a job row; ``False`` when its condition failed
        (the lease was lost, the job is not in the expected state). ``JobReroute`` moves
        many queued rows and answers how many."""
        ...

    def job_list(self, params: JobQuery) -> list[Job]:
        """Jobs matching a ``JobFilter``, newest (highest id) first, at most ``limit``; the
        running jobs of a worker asked to stop (``CancelRequested``); or those whose lease
        expired (``LeasesExpired``), which the caller re-queues."""
        ...

    def job_match(self, params: JobMatch) -> list[int]:
        """Ids of production jobs matching every filter of a bulk action, oldest first."""
        ...

    # -- reports ----------------------------------------------------------------------------

    @overload
    def report(self, query: JobStats) -> list[StatRow]: ...

    @overload
    def report(self, query: JobCount) -> int: ...

    @overload
    def report(self, query: JobGauges) -> list[JobGauge]: ...

    @overload
    def report(self, query: JobsScheduled) -> tuple[int, float | None]: ...

    @overload
    def report(self, query: JobDurations) -> list[float]: ...

    @overload
    def report(self, query: OutOfOrder) -> list[OrderBreak]: ...

    @overload
    def report(self, query: VersionOutcomes) -> list[VersionOutcome]: ...

    @overload
    def report(self, query: SignalCounts) -> list[tuple[str, str, int]]: ...

    @overload
    def report(self, query: SignalSeries) -> list[SignalBucket]: ...

    @overload
    def report(self, query: OutboxPending) -> OutboxBacklog: ...

    def report(self, query: ReportQuery) -> object:
        """Answer one of the operators' questions (``storage/reports.py`` lists them)."""
        ...

    # -- trace ------------------------------------------------------------------------------

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """Append ``events``; with ``fence`` only while it holds the lease (else ``False``)."""
        ...

    @overload
    def trace_query(self, params: TraceQuery) -> list[TraceEvent]: ...

    @overload
    def trace_query(self, params: TraceJobs) -> list[JobTrace]: ...

    @overload
    def trace_query(self, params: TraceWindow) -> list[tuple[TraceEvent, str, str | None]]: ...

    def trace_query(
        self, params: TraceRead
    ) -> list[TraceEvent] | list[JobTrace] | list[tuple[TraceEvent, str, str | None]]:
        """The events of a job, a trace or a resource (``TraceQuery``); of several jobs at
        once (``TraceJobs``); or ``(event, job type, version)`` of a time window, a page in
        HLC order (``TraceWindow``)."""
        ...

    # -- contracts and rollouts -------------------------------------------------------------

    @overload
    def rollout_query(self, query: ContractQuery) -> list[ContractRecord]: ...

    @overload
    def rollout_query(self, query: ActiveVersion) -> str | None: ...

    @overload
    def rollout_query(self, query: RoutingQuery) -> list[RoutingRecord]: ...

    @overload
    def rollout_query(self, query: RoutingHistory) -> list[RoutingEvent]: ...

    @overload
    def rollout_query(self, query: ComparisonQuery) -> list[Comparison]: ...

    def rollout_query(self, query: RolloutQuery) -> object:
        """Contracts, the active version, routing records and their history, comparisons."""
        ...

    @overload
    def rollout_update(self, change: RoutingPut) -> int | None: ...

    @overload
    def rollout_update(self, change: ContractPut | ContractActivate | ComparisonPut) -> None: ...

    def rollout_update(self, change: RolloutChange) -> int | None:
        """Store a contract, activate a version, write a routing record (compare-and-set on
        its revision: the new one, or ``None`` when it changed since it was read) or a
        comparison."""
        ...

    # -- state ------------------------------------------------------------------------------

    def entity_get(self, params: EntityGet) -> EntityRecord | None: ...

    def entity_list(self, params: EntityFilter) -> list[EntityRecord]: ...

    def entity_put(
        self, row: EntityRecord, expected_version: int | None, *, copy_on_write: bool = False
    ) -> bool:
        """Compare-and-set the head from ``expected_version`` (0: new) and insert the version.

        ``expected_version=None`` inserts the version without moving the head (importing
        a recorded case). ``copy_on_write``: ``row.branch`` reads the entity through to
        its base until it writes it (a fork's branch): with no head of the entity there
        yet the head is started, whatever ``expected_version``; else compare-and-set as
        above. In a ``pipelined(refusals=True)`` block on PostgreSQL that is one
        statement, sent unread and refusing; elsewhere the head is looked up first.
        """
        ...

    def branch_create(self, params: BranchCreate, versions: Sequence[EntityRecord] = ()) -> None:
        """Create a branch (once: an existing one is an error), with ``versions`` on it: the
        versions a run wrote there before the branch was stored (a dry-run writes its
        branch at its end). Each is inserted in order and each entity's head set at its
        last one, in two statements whatever their number: no head on a new branch to
        compare with, and each version was checked against the ones before it when made.
        """
        ...

    def branch_get(self, branch: str) -> Branch | None: ...

    # -- locks ------------------------------------------------------------------------------

    @overload
    def lock_transition(self, change: LockAcquire) -> LockGrant | None: ...

    @overload
    def lock_transition(self, change: LockRenew) -> bool: ...

    @overload
    def lock_transition(self, change: LockRelease) -> Lock | None: ...

    @overload
    def lock_transition(self, change: LockReleaseInTime) -> bool: ...

    def lock_transition(self, change: LockChange) -> LockGrant | Lock | bool | None:
        """Acquire (the new fencing token and HLC, or ``None`` when held), renew (whether
        it was held), release in time (whether it was held and had not run out) or release
        or break a lock (the lock as left, or ``None``)."""
        ...

    def lock_list(self, params: LockFilter) -> list[Lock]: ...

    # -- effects (idempotency records) ------------------------------------------------------

    def idem_transition(self, change: IdemChange) -> bool:
        """Claim, take over, settle or compensate one record; ``False`` when its
        compare-and-set failed (the key exists, the claim moved on)."""
        ...

    def idem_list(self, params: IdemFilter) -> list[IdemRecord]: ...

    # -- cache, outbox, steps, blobs, lineage -----------------------------------------------

    def cache_update(self, change: CacheChange) -> None:
        """Write an entry, or drop the entries of a key or of an entity."""
        ...

    def cache_get(self, params: CacheLookup) -> CacheRecord | None: ...

    def outbox_update(self, change: OutboxChange) -> bool:
        """Insert a row (``False``, nothing written, when its ``event_id`` exists) or mark a
        claimed one published or failed."""
        ...

    def outbox_claim(self, params: OutboxClaim) -> list[OutboxRecord]: ...

    def outbox_by_job(self, job_id: int) -> list[OutboxRecord]: ...

    def step_complete(self, params: StepComplete) -> bool:
        """Record that a step of a job committed, with its result; first completion wins."""
        ...

    def step_by_job(self, job_id: int) -> list[StepRecord]:
        """The job's committed steps (the step ledger), oldest attempt first."""
        ...

    def blob_put(self, params: BlobPut) -> None: ...

    def blob_get(self, digest: str) -> Blob | None: ...

    def lineage_put(self, params: LineagePut) -> None: ...

    def lineage_list(self, params: LineageQuery) -> list[LineageRecord]:
        """Where a trace came from, the traces derived from one, or a page of them all."""
        ...

    # -- schedules --------------------------------------------------------------------------

    def schedule_update(self, change: ScheduleChange) -> bool:
        """Register, advance (compare-and-set on the anchor) or note a schedule's slot."""
        ...

    def schedule_list(self, name: str | None = None) -> list[ScheduleRecord]: ...

    # -- retention --------------------------------------------------------------------------

    def keep_transition(self, change: KeepChange) -> bool:
        """Pin a job, or hold or release one for a live fork (see ``KeepChange``)."""
        ...

    @overload
    def gc_scan(self, query: KeptJobs) -> list[KeepRecord]: ...
    @overload
    def gc_scan(self, query: GcScan) -> list[GcCandidate]: ...
    @overload
    def gc_scan(self, query: GcCursor) -> int: ...
    @overload
    def gc_scan(self, query: GcHighestId) -> int: ...
    @overload
    def gc_scan(self, query: JobHours) -> list[JobHour]: ...
    @overload
    def gc_scan(self, query: DerivedScan) -> list[DerivedCandidate]: ...
    @overload
    def gc_scan(self, query: BlobScan) -> list[BlobCandidate]: ...
    def gc_scan(self, query: GcQuery) -> GcAnswer:
        """Answer one of gc's questions (see ``GcQuery``)."""
        ...

    @overload
    def gc_apply(self, change: GcCount) -> int: ...
    @overload
    def gc_apply(self, change: LedgerDrop) -> LedgerDropped: ...
    def gc_apply(self, change: GcChange) -> int | LedgerDropped:
        """Apply one of gc's changes (see ``GcChange``); how many events, jobs or rows it
        removed (0: nothing, or the job or derived trace is held). ``LedgerDrop``: the
        expired ledger days dropped (none on a backend without partitions), and those
        kept because the owner's objects depend on them."""
        ...


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


def storage_closed(what: str) -> StorageError:
    """The error of a storage used after its ``close()``: a ``StorageError``, not
    ``DatabaseUnavailableError`` (waiting would never make it usable again)."""
    return StorageError(f"{what}: this storage is closed (its close() was called); open a new one")


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Split ``items`` into slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def idem_get(tx: Transaction, key: str) -> IdemRecord | None:
    """The idempotency record of ``key``, if there is one."""
    found = tx.idem_list(IdemFilter(key=key))
    return found[0] if found else None


def lock_get(tx: Transaction, resource: str, now: float | None = None) -> Lock | None:
    """The lock row of ``resource`` (held or not), if there is one; ``expired`` judged in
    ``now``, or in the database's clock when ``None``."""
    found = tx.lock_list(LockFilter(resource=resource, now=now))
    return found[0] if found else None
