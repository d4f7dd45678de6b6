"""The storage seam: a small protocol with noun-first verbs taking parameter dataclasses.

Domain code (queue, worker, context, replay) talks to a ``Storage`` and the
``Transaction`` objects it hands out; it never sees a driver. Every verb that
depends on time takes ``now`` from the caller's ``Clock``. Backends live in
``storage/sqlite/`` and ``storage/postgres/`` and pass one conformance suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, overload, runtime_checkable

from replayq.model import Job, StatRow, TraceEvent
from replayq.storage.params import (
    BlobPurge,
    BlobPut,
    BlobScan,
    BranchCreate,
    CacheDelete,
    CacheLookup,
    CachePut,
    ComparisonPut,
    DerivedPurge,
    DerivedScan,
    EntityFilter,
    EntityGet,
    GcChange,
    GcCursor,
    GcCursorPut,
    GcQuery,
    GcScan,
    GcVacuum,
    IdemChange,
    IdemClaim,
    IdemCompensate,
    IdemFail,
    IdemFilter,
    IdemPurge,
    IdemResolve,
    IdemSucceed,
    IdemTakeover,
    JobBury,
    JobCancel,
    JobCancelRequest,
    JobCancelRunning,
    JobChange,
    JobComplete,
    JobFilter,
    JobHours,
    JobInsert,
    JobLease,
    JobMatch,
    JobPurge,
    JobRedeliver,
    JobReleaseRunning,
    JobRequeue,
    JobReroute,
    JobRetry,
    JobRoute,
    JobSetRecorded,
    JobTrace,
    KeepChange,
    KeepHold,
    KeepPin,
    KeepRelease,
    KeptJobs,
    LeaseExtend,
    LeaseRelease,
    LineagePut,
    LockAcquire,
    MessageIdForget,
    MigrationStatus,
    OutboxInsert,
    OutboxMark,
    RoutingPut,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleMade,
    ScheduleRegister,
    TraceJobs,
    TraceQuery,
    TraceTrim,
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

GcAnswer = (
    list[KeepRecord]
    | list[GcCandidate]
    | int
    | list[JobHour]
    | list[DerivedCandidate]
    | list[BlobCandidate]
)
"""What ``gc_scan`` answers, by question."""

__all__ = [
    "Blob",
    "BlobCandidate",
    "BlobPurge",
    "BlobPut",
    "BlobScan",
    "Branch",
    "BranchCreate",
    "CacheDelete",
    "CacheLookup",
    "CachePut",
    "CacheRecord",
    "Comparison",
    "ComparisonPut",
    "ContractRecord",
    "DerivedCandidate",
    "DerivedPurge",
    "DerivedScan",
    "EntityFilter",
    "EntityGet",
    "EntityRecord",
    "GcAnswer",
    "GcCandidate",
    "GcChange",
    "GcCursor",
    "GcCursorPut",
    "GcQuery",
    "GcScan",
    "GcVacuum",
    "IdemChange",
    "IdemClaim",
    "IdemCompensate",
    "IdemFail",
    "IdemFilter",
    "IdemPurge",
    "IdemRecord",
    "IdemResolve",
    "IdemSucceed",
    "IdemTakeover",
    "JobBury",
    "JobCancel",
    "JobCancelRequest",
    "JobCancelRunning",
    "JobChange",
    "JobComplete",
    "JobFilter",
    "JobGauge",
    "JobHour",
    "JobHours",
    "JobInsert",
    "JobLease",
    "JobMatch",
    "JobPurge",
    "JobRedeliver",
    "JobReleaseRunning",
    "JobRequeue",
    "JobReroute",
    "JobRetry",
    "JobRoute",
    "JobSetRecorded",
    "JobTrace",
    "KeepChange",
    "KeepHold",
    "KeepPin",
    "KeepRecord",
    "KeepRelease",
    "KeptJobs",
    "LeaseExtend",
    "LeaseRelease",
    "LineagePut",
    "LineageRecord",
    "ListenHandle",
    "Listener",
    "Lock",
    "LockAcquire",
    "LockGrant",
    "MessageIdForget",
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
    "StepRecord",
    "Storage",
    "TraceJobs",
    "TraceQuery",
    "TraceTrim",
    "TraceWindow",
    "Transaction",
    "VersionOutcome",
    "idem_get",
    "iter_chunks",
]


class Transaction(Protocol):
    """The verbs, all inside one database transaction."""

    connection: Any
    """The driver connection the transaction runs on (for ``ctx.db_write``)."""

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        """Insert a job; on a duplicate ``message_id`` of the same job type return
        ``(existing_id, False)``."""
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

    def job_transition(self, change: JobChange) -> bool:
        """Apply one compare-and-set to a job row; ``False`` when its condition failed
        (the lease was lost, the job is not in the expected state)."""
        ...

    def lease_reap(self, now: float, limit: int) -> list[Job]:
        """Jobs whose lease expired, as they were before this call; the caller re-queues them."""
        ...

    def job_reroute(self, params: JobReroute) -> int:
        """Move queued jobs of a type from one version to another; returns how many."""
        ...

    def job_list(self, params: JobFilter) -> list[Job]:
        """Jobs matching ``params``, newest (highest id) first, at most ``params.limit``."""
        ...

    def job_count(self, params: JobFilter) -> int:
        """How many jobs match ``params``'s filters (``limit`` and ``before`` ignored)."""
        ...

    def job_match(self, params: JobMatch) -> list[int]:
        """Ids of production jobs matching every filter of a bulk action, oldest first."""
        ...

    def job_cancel_requested(self, worker_id: str) -> set[int]:
        """Which of this worker's running jobs were asked to stop."""
        ...

    def job_scheduled(self, now: float, queues: Sequence[str] | None) -> tuple[int, float | None]:
        """Queued jobs not due yet (delayed or backing off): ``(count, first run_at)``."""
        ...

    def job_stats(self) -> list[StatRow]: ...

    def job_gauges(self, now: float) -> list[JobGauge]:
        """Open jobs (queued, running, dead) counted by queue, type, version and state."""
        ...

    def job_out_of_order(self) -> list[OrderBreak]:
        """Jobs run (or waiting) after an earlier job of their ordering key died or was
        cancelled, counted by ``queue``, ``job_type`` and ``version``."""
        ...

    def job_durations(self, job_type: str, version: str | None) -> list[float]: ...

    # -- trace ------------------------------------------------------------------------------

    def trace_append(self, events: Sequence[TraceEvent]) -> None: ...

    def trace_query(self, params: TraceQuery) -> list[TraceEvent]:
        """The events of a job, a trace or a resource (see ``TraceQuery``)."""
        ...

    def trace_jobs(self, params: TraceJobs) -> list[JobTrace]:
        """Each job's events, as ``trace_query(TraceQuery(job_id=...))`` gives them, in no
        particular order of jobs; a job without events is absent."""
        ...

    def trace_window(self, params: TraceWindow) -> list[tuple[TraceEvent, str, str | None]]:
        """``(event, job type, version)`` in HLC order: a page of a time window."""
        ...

    def signal_counts(self, names: Sequence[str], since: float) -> list[tuple[str, str, int]]:
        """``(job type, event name, count)`` of production jobs' events since ``since``."""
        ...

    def signal_series(
        self, names: Sequence[str], since_hlc: int, until_hlc: int, bucket_ms: int
    ) -> list[SignalBucket]:
        """Counts of the named events per time bucket, job type, version and name."""
        ...

    # -- contracts and rollouts -------------------------------------------------------------

    def contract_put(self, job_type: str, version: str, body_json: str, now: float) -> None: ...

    def contract_list(
        self, job_type: str | None, version: str | None = None
    ) -> list[ContractRecord]:
        """Stored contracts, of one type (and one version of it) when given."""
        ...

    def contract_activate(self, job_type: str, version: str, now: float) -> None:
        """Record ``version`` as the one new jobs of ``job_type`` run under."""
        ...

    def contract_active(self, job_type: str) -> str | None: ...

    def routing_list(self, job_type: str | None = None) -> list[RoutingRecord]:
        """Every type's routing record, or the one of ``job_type`` (if it has one)."""
        ...

    def routing_put(self, params: RoutingPut) -> int | None:
        """The new revision, or ``None`` when the record changed since it was read."""
        ...

    def routing_events(self, job_type: str) -> list[RoutingEvent]:
        """Every change of the type's routing, oldest first, with actor and reason."""
        ...

    def comparison_put(self, params: ComparisonPut) -> None: ...

    def comparison_list(self, job_type: str, mode: str | None, limit: int) -> list[Comparison]: ...

    def version_outcomes(self, job_type: str, since: float) -> list[VersionOutcome]:
        """Attempt ends, decisions and incidents of a type since ``since``, with the version."""
        ...

    # -- state ------------------------------------------------------------------------------

    def entity_get(self, params: EntityGet) -> EntityRecord | None: ...

    def entity_list(self, params: EntityFilter) -> list[EntityRecord]: ...

    def entity_put(self, row: EntityRecord, expected_version: int | None) -> bool:
        """Compare-and-set the head from ``expected_version`` (0: new) and insert the version.

        ``expected_version=None`` inserts the version without moving the head (importing
        a recorded case).
        """
        ...

    def branch_create(self, params: BranchCreate) -> None: ...

    def branch_get(self, branch: str) -> Branch | None: ...

    # -- locks ------------------------------------------------------------------------------

    def lock_acquire(self, params: LockAcquire) -> LockGrant | None:
        """Take the lock if free or expired; its new fencing token and HLC, else ``None``."""
        ...

    def lock_get(self, resource: str) -> Lock | None:
        """The lock row (held or not): its holder and current fencing token."""
        ...

    def lock_list(self) -> list[Lock]:
        """Locks currently held."""
        ...

    def lock_renew(self, resource: str, owner_token: str, now: float, ttl: float) -> bool: ...

    def lock_release(self, resource: str, owner_token: str | None, hlc: int) -> Lock | None:
        """Free a lock held by ``owner_token``; ``owner_token=None`` breaks it whoever holds
        it, and bumps the fencing token so the old holder's later writes are refused.

        The lock as left, or ``None`` when it was not held (by that owner).
        """
        ...

    # -- effects (idempotency records) ------------------------------------------------------

    def idem_transition(self, change: IdemChange) -> bool:
        """Claim, take over, settle or compensate one record; ``False`` when its
        compare-and-set failed (the key exists, the claim moved on)."""
        ...

    def idem_list(self, params: IdemFilter) -> list[IdemRecord]: ...

    # -- cache, outbox, steps, blobs, lineage -----------------------------------------------

    def cache_put(self, params: CachePut) -> None: ...

    def cache_get(self, params: CacheLookup) -> CacheRecord | None: ...

    def cache_delete(self, params: CacheDelete) -> None: ...

    def outbox_insert(self, params: OutboxInsert) -> bool:
        """Insert an outbox row; ``False`` (nothing written) when its ``event_id`` exists."""
        ...

    def outbox_claim(self, now: float, claim_seconds: float, limit: int) -> list[OutboxRecord]: ...

    def outbox_mark(self, params: OutboxMark) -> bool: ...

    def outbox_backlog(self) -> OutboxBacklog: ...

    def outbox_by_job(self, job_id: int) -> list[OutboxRecord]: ...

    def step_complete(self, params: Mapping[str, Any]) -> bool:
        """Record that a step of a job committed, with its result; first completion wins."""
        ...

    def step_by_job(self, job_id: int) -> list[StepRecord]:
        """The job's committed steps (the step ledger), oldest attempt first."""
        ...

    def blob_put(self, params: BlobPut) -> None: ...

    def blob_get(self, digest: str) -> Blob | None: ...

    def lineage_put(self, params: LineagePut) -> None: ...

    def lineage_list(
        self, trace_id: str | None = None, source_trace_id: str | None = None
    ) -> list[LineageRecord]:
        """Where ``trace_id`` came from, or every trace derived from ``source_trace_id``."""
        ...

    def lineage_page(self, after: tuple[float, str], limit: int) -> list[LineageRecord]:
        """Derived traces created after the ``(created_at, trace_id)`` cursor, oldest first."""
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
    def gc_scan(self, query: JobHours) -> list[JobHour]: ...
    @overload
    def gc_scan(self, query: DerivedScan) -> list[DerivedCandidate]: ...
    @overload
    def gc_scan(self, query: BlobScan) -> list[BlobCandidate]: ...
    def gc_scan(self, query: GcQuery) -> GcAnswer:
        """Answer one of gc's questions (see ``GcQuery``)."""
        ...

    def gc_apply(self, change: GcChange) -> int:
        """Apply one of gc's changes (see ``GcChange``); how many events, jobs or rows it
        removed (0: nothing, or the job or derived trace is held)."""
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

    def close(self) -> None: ...


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Split ``items`` into slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def idem_get(tx: Transaction, key: str) -> IdemRecord | None:
    """The idempotency record of ``key``, if there is one."""
    found = tx.idem_list(IdemFilter(key=key))
    return found[0] if found else None
