"""The storage seam: a small protocol with noun-first verbs taking parameter dataclasses.

Domain code (queue, worker, context, replay) talks to a ``Storage`` and the
``Transaction`` objects it hands out; it never sees a driver. Every verb that
depends on time takes ``now`` from the caller's ``Clock``. Backends live in
``storage/sqlite/`` and ``storage/postgres/`` and pass one conformance suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from replayq.model import Job, StatRow, TraceEvent
from replayq.storage.params import (
    BlobPut,
    BranchCreate,
    CacheDelete,
    CacheLookup,
    CachePut,
    ComparisonPut,
    EntityFilter,
    EntityGet,
    GcScan,
    IdemChange,
    IdemClaim,
    IdemCompensate,
    IdemFail,
    IdemFilter,
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
    JobInsert,
    JobLease,
    JobMatch,
    JobRedeliver,
    JobReleaseRunning,
    JobRequeue,
    JobReroute,
    JobRetry,
    JobRoute,
    JobSetRecorded,
    JobTrace,
    LeaseExtend,
    LeaseRelease,
    LineagePut,
    LockAcquire,
    MigrationStatus,
    OutboxInsert,
    OutboxMark,
    RoutingPut,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleMade,
    ScheduleRegister,
    StepComplete,
    TraceFence,
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

__all__ = [
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
    "JobComplete",
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
    "KeepRecord",
    "LeaseExtend",
    "LeaseRelease",
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
]


class Transaction(Protocol):
    """The verbs, all inside one database transaction."""

    connection: Any
    """The driver connection the transaction runs on (for ``ctx.db_write``)."""

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        """Insert a job; on a duplicate ``message_id`` return ``(existing_id, False)``."""
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

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """Append ``events`` (one ``rq_trace`` pack per job attempt among them).

        With ``fence``: only while its owner token holds the job's lease, checked in
        the statement that writes the first pack (on PostgreSQL the job row is then
        kept as read until the transaction ends, as ``lease_check`` keeps it);
        ``False``, nothing appended, once the lease is gone. The caller raises, so the
        transaction's other writes roll back. Without ``fence`` always ``True``.
        """
        ...

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

    def step_complete(self, params: StepComplete) -> bool:
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

    def job_keep(self, job_id: int, reason: str, now: float) -> None:
        """Pin a job: gc never collects it (``replayq keep``)."""
        ...

    def keep_list(self) -> list[KeepRecord]: ...

    def gc_candidates(self, params: GcScan) -> list[GcCandidate]:
        """Finished, unpinned jobs past the cutoff that no younger derived trace uses."""
        ...

    def gc_cursor(self, name: str) -> int:
        """The last job id the gc pass ``name`` finished with (0: from the start)."""
        ...

    def gc_cursor_put(self, name: str, cursor: int, now: float) -> None: ...

    def trace_trim(self, job_id: int, keep: Callable[[TraceEvent], bool]) -> int:
        """Rewrite the job's trace packs with only the events ``keep`` accepts (a pack left
        empty is deleted, with its resource index entries); the number of events removed."""
        ...

    def job_purge(self, job_id: int) -> None:
        """Count a job into its hour (``job_hours``), then delete it: its row, its trace
        packs and their index entries, its steps."""
        ...

    def job_hours(self, job_type: str | None = None) -> list[JobHour]:
        """The aggregates of the jobs gc deleted, oldest hour first."""
        ...

    def idem_purge(self, job_id: int) -> None:
        """Forget a job's settled idempotency records (an in-flight claim stays)."""
        ...

    def gc_vacuum(self) -> None:
        """Give freed pages back (SQLite incremental vacuum; nothing on PostgreSQL)."""
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
