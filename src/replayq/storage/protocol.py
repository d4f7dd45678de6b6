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
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from replayq.model import Job, StatRow, TraceEvent


@dataclass(frozen=True, slots=True)
class JobInsert:
    job_type: str
    queue: str
    payload_json: str
    priority: int
    run_at: float
    now: float
    max_attempts: int
    trace_id: str
    hlc: int
    message_id: str | None = None
    ordering_key: str | None = None
    idempotency_key: str | None = None
    handler_version: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    origin: str = "production"
    # The enqueuer's W3C traceparent (OpenTelemetry), for the attempt spans' parent.
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class JobLease:
    """Claim up to ``limit`` jobs; each gets the lease (and handler version) of its type."""

    worker_id: str
    owner_token: str
    now: float
    hlc: int
    limit: int
    default_lease_seconds: float
    lease_for: Mapping[str, float] = field(default_factory=dict)
    version_for: Mapping[str, str] = field(default_factory=dict)
    queues: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class LeaseExtend:
    job_id: int
    owner_token: str
    now: float
    lease_seconds: float


@dataclass(frozen=True, slots=True)
class JobComplete:
    job_id: int
    owner_token: str
    now: float
    result_json: str | None
    hlc: int


@dataclass(frozen=True, slots=True)
class JobRetry:
    job_id: int
    owner_token: str
    now: float
    run_at: float
    error_class: str
    error: str
    hlc: int


@dataclass(frozen=True, slots=True)
class JobBury:
    """Move a running job to ``dead`` (CAS on its owner); ``owner_token=None``: a queued one."""

    job_id: int
    owner_token: str | None
    now: float
    reason: str
    error_class: str | None
    error: str | None
    hlc: int


@dataclass(frozen=True, slots=True)
class JobFilter:
    states: Sequence[str] | None = None
    job_type: str | None = None
    origin: str | None = "production"
    limit: int = 100
    # Only jobs routed to this handler version (``jobs list --version``).
    version: str | None = None
    # Keyset pagination: only jobs with a smaller id (the last id of the page before).
    before: int | None = None


@dataclass(frozen=True, slots=True)
class RoutingPut:
    """Write a job type's routing record: compare-and-set on the revision the caller read.

    ``expected_revision=0`` creates the record. The change is appended to the type's
    routing events with who made it and why, in the same transaction.
    """

    job_type: str
    body_json: str
    expected_revision: int
    action: str
    actor: str
    reason: str | None
    now: float


@dataclass(frozen=True, slots=True)
class JobMatch:
    """The filters of a bulk action (``replayq jobs requeue|cancel|dry-run``); ``None``: any.

    ``since``/``until`` bound when a job settled, or when it was enqueued if it is open.
    """

    states: Sequence[str] | None = None
    job_type: str | None = None
    version: str | None = None
    queue: str | None = None
    error_class: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """Events of production jobs with ``since_hlc <= hlc < until_hlc``, after a cursor.

    ``resource`` is a prefix; ``None`` filters nothing. Pages follow ``(after_hlc, after_id)``.
    """

    since_hlc: int
    until_hlc: int
    job_type: str | None = None
    version: str | None = None
    name: str | None = None
    resource: str | None = None
    after_hlc: int = -1
    after_id: int = -1
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: float | None


# -- parameters of the queue's transitions (one verb: ``job_transition``) ----------------------


@dataclass(frozen=True, slots=True)
class JobCancel:
    """Cancel a job that is still ``queued`` (a running one is asked: ``JobCancelRequest``)."""

    job_id: int
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobCancelRequest:
    """Ask a running job to stop; fails if it is not running (or was already asked)."""

    job_id: int
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobCancelRunning:
    """End a running job that was asked to stop as ``cancelled`` (CAS on the owner)."""

    job_id: int
    owner_token: str
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobReleaseRunning:
    """Give a running job that was asked to stop back to the queue on ``to_version``.

    The release of ``rollout rollback --release-inflight``: a CAS on the owner, the
    attempt number kept and one more in the budget (as ``LeaseRelease``).
    """

    job_id: int
    owner_token: str
    to_version: str
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobRequeue:
    """Move a ``dead`` job back to ``queued`` with a fresh attempt budget.

    Its version is ``to_version``, or chosen afresh at its next lease when ``None``.
    """

    job_id: int
    now: float
    hlc: int
    extra_attempts: int = 1
    to_version: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseRelease:
    """Give a running job back to the queue (shutdown): one more attempt in its budget.

    The attempt number is kept, so the next run is a new attempt whose events never
    collide with the released run's (outbox event ids are per step position, not per
    attempt: a step the released run committed is not published twice).
    """

    job_id: int
    owner_token: str
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobRedeliver:
    """Re-queue a job whose lease expired; compare-and-set on the expired owner token."""

    job_id: int
    owner_token: str
    now: float
    hlc: int


@dataclass(frozen=True, slots=True)
class JobRoute:
    """Set the version of a running job this owner holds: leased without one, or with one
    its routing no longer names (the worker decides; the row is a CAS on the owner)."""

    job_id: int
    owner_token: str
    version: str


@dataclass(frozen=True, slots=True)
class JobSetRecorded:
    """Mark an imported regression-case job as it was recorded."""

    job_id: int
    handler_version: str | None
    result_json: str
    attempt: int


JobChange = (
    LeaseExtend
    | JobComplete
    | JobRetry
    | JobBury
    | JobCancel
    | JobCancelRequest
    | JobCancelRunning
    | JobReleaseRunning
    | JobRequeue
    | LeaseRelease
    | JobRedeliver
    | JobRoute
    | JobSetRecorded
)
"""Every compare-and-set on one job row: ``job_transition`` returns whether it applied."""


@dataclass(frozen=True, slots=True)
class JobReroute:
    """Move the queued jobs of a type from one version to another."""

    job_type: str
    from_version: str
    to_version: str


@dataclass(frozen=True, slots=True)
class TraceQuery:
    """Which events ``trace_query`` reads: exactly one of the three filters is set.

    ``job_id``: the job's events in HLC order; ``trace_id``: one trace's events;
    ``resource``: events on the resource or on its versioned keys (``resource:v<N>``),
    in HLC order, across jobs and workers.
    """

    job_id: int | None = None
    trace_id: str | None = None
    resource: str | None = None


@dataclass(frozen=True, slots=True)
class TraceJobs:
    """Which jobs' events ``trace_jobs`` reads, all in one query (a bulk dry-run's batch)."""

    job_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class JobTrace:
    """One job's events as ``trace_jobs`` returns them: in HLC order, like ``trace_query``."""

    job_id: int
    events: list[TraceEvent]


# -- parameters of the rollout, state, lock, effect, cache, outbox, blob, lineage and schedule verbs


@dataclass(frozen=True, slots=True)
class ComparisonPut:
    """One shadow or dual-run comparison of a job under a candidate version."""

    job_type: str
    job_id: int
    attempt: int
    mode: str
    from_version: str | None
    to_version: str
    classes: str
    report: str
    now: float


@dataclass(frozen=True, slots=True)
class EntityGet:
    """One version of an entity: the head (neither filter), ``version``, or the newest
    written at or before ``at_hlc``."""

    branch: str
    namespace: str
    key: str
    version: int | None = None
    at_hlc: int | None = None


@dataclass(frozen=True, slots=True)
class EntityFilter:
    """Versions written by ``job_id`` (HLC order), or of one entity after ``after_version``."""

    job_id: int | None = None
    branch: str | None = None
    namespace: str | None = None
    key: str | None = None
    after_version: int = 0


@dataclass(frozen=True, slots=True)
class BranchCreate:
    branch: str
    base_branch: str
    base_hlc: int
    origin: str
    now: float


@dataclass(frozen=True, slots=True)
class LockAcquire:
    resource: str
    owner_token: str
    job_id: int | None
    worker_id: str | None
    now: float
    ttl: float
    hlc: int


@dataclass(frozen=True, slots=True)
class IdemClaim:
    """Claim a business key before its side effect runs; fails when the key exists."""

    key: str
    operation: str
    claim_token: str
    now: float
    trace_id: str | None
    job_id: int | None
    attempt: int | None


@dataclass(frozen=True, slots=True)
class IdemTakeover:
    """Claim again a record left ``expected_status`` by ``expected_claim``."""

    key: str
    claim_token: str
    now: float
    trace_id: str | None
    job_id: int | None
    attempt: int | None
    expected_status: str
    expected_claim: str


@dataclass(frozen=True, slots=True)
class IdemSucceed:
    key: str
    claim_token: str
    result: str | None
    result_ref: str | None
    now: float


@dataclass(frozen=True, slots=True)
class IdemFail:
    key: str
    claim_token: str
    error: str
    now: float


@dataclass(frozen=True, slots=True)
class IdemCompensate:
    """A ``succeeded`` record whose effect was reversed (rollback)."""

    key: str
    now: float


@dataclass(frozen=True, slots=True)
class IdemResolve:
    """Settle an in-doubt record: compare-and-set on ``status = 'started'`` and its claim."""

    key: str
    claim_token: str
    status: str
    result: str | None
    error: str | None
    now: float


IdemChange = IdemClaim | IdemTakeover | IdemSucceed | IdemFail | IdemCompensate | IdemResolve
"""Every write of an idempotency record: ``idem_transition`` returns whether it applied."""


@dataclass(frozen=True, slots=True)
class IdemFilter:
    """Effect records by ``key``, by ``job_id`` (oldest first), or newest first by
    ``operation``; ``in_doubt``: only ``started`` by an attempt that no longer runs."""

    key: str | None = None
    job_id: int | None = None
    operation: str | None = None
    in_doubt: bool = False
    limit: int = 100


@dataclass(frozen=True, slots=True)
class CachePut:
    key: str
    base_key: str
    value: str
    version: int | None
    source_namespace: str | None
    source_key: str | None
    now: float
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """An unexpired entry by ``key``, or the newest one of ``base_key``."""

    now: float
    key: str | None = None
    base_key: str | None = None


@dataclass(frozen=True, slots=True)
class CacheDelete:
    """Drop the entries of ``base_key``, or those derived from entity ``namespace``/``key``."""

    base_key: str | None = None
    namespace: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxInsert:
    event_id: str
    topic: str
    payload: str
    job_id: int | None
    trace_id: str | None
    now: float


@dataclass(frozen=True, slots=True)
class OutboxMark:
    """A claimed row published (``error is None``) or failed with ``error``."""

    row_id: int
    now: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BlobPut:
    hash: str
    codec: str
    size: int
    stored_size: int
    body: bytes
    now: float


@dataclass(frozen=True, slots=True)
class LineagePut:
    trace_id: str
    origin: str
    source_trace_id: str
    source_job_id: int | None
    branch: str | None
    details: str
    now: float


@dataclass(frozen=True, slots=True)
class ScheduleRegister:
    """Store a periodic job's declaration; a new one is anchored at ``now``."""

    name: str
    cron: str
    job_type: str
    timezone: str
    missed: str
    next_slot: float | None
    now: float


@dataclass(frozen=True, slots=True)
class ScheduleAdvance:
    """Compare-and-set of a schedule's anchor (the newest decided slot)."""

    name: str
    expected_anchor: float
    anchor: float
    next_slot: float | None
    now: float


@dataclass(frozen=True, slots=True)
class ScheduleMade:
    """Note the newest slot a schedule enqueued and the job it made."""

    name: str
    last_slot: float
    last_job_id: int


ScheduleChange = ScheduleRegister | ScheduleAdvance | ScheduleMade


# -- records the verbs return (one column per field) --------------------------------------------


@dataclass(frozen=True, slots=True)
class JobGauge:
    """Open production jobs of one queue, type, version and state (``replayq metrics``)."""

    queue: str
    job_type: str
    version: str
    state: str
    count: int
    oldest_ready: float | None
    oldest_leased: float | None


@dataclass(frozen=True, slots=True)
class OrderBreak:
    """Production jobs of one queue, type and version run (or waiting) after an earlier job
    of their ordering key died or was cancelled (``replayq_jobs_out_of_order``)."""

    queue: str
    job_type: str
    version: str
    count: int


@dataclass(frozen=True, slots=True)
class SignalBucket:
    """How many events of ``name`` fell in one time bucket for a type and version."""

    bucket_ms: int
    job_type: str
    version: str | None
    name: str
    count: int


@dataclass(frozen=True, slots=True)
class VersionOutcome:
    """An attempt's end, a decision or an incident of a job, with the version that ran it."""

    job_id: int
    attempt: int | None
    name: str
    version: str | None
    error_class: str | None
    duration: float | None
    reason: str | None
    stale: bool | None


@dataclass(frozen=True, slots=True)
class ContractRecord:
    job_type: str
    version: str
    body: str
    registered_at: float


@dataclass(frozen=True, slots=True)
class RoutingRecord:
    job_type: str
    body: str
    revision: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class RoutingEvent:
    id: int
    job_type: str
    revision: int
    action: str
    actor: str
    reason: str | None
    body: str
    ts: float


@dataclass(frozen=True, slots=True)
class Comparison:
    id: int
    job_type: str
    job_id: int
    attempt: int
    mode: str
    from_version: str | None
    to_version: str
    classes: str
    report: str
    ts: float


@dataclass(frozen=True, slots=True)
class EntityRecord:
    """One copy-on-write version of an entity; also what ``entity_put`` writes."""

    branch: str
    namespace: str
    key: str
    version: int
    parent_version: int | None
    data: str | None
    data_ref: str | None
    delta: str
    job_id: int | None
    trace_id: str | None
    attempt: int | None
    fencing_token: int | None
    created_at: float
    hlc: int


@dataclass(frozen=True, slots=True)
class Branch:
    branch: str
    base_branch: str
    base_hlc: int
    origin: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Lock:
    """A lock row; ``owner_token is None`` when nobody holds it."""

    resource: str
    owner_token: str | None
    fencing_token: int
    job_id: int | None
    worker_id: str | None
    acquired_at: float | None
    expires_at: float | None
    hlc: int


@dataclass(frozen=True, slots=True)
class LockGrant:
    fencing_token: int
    hlc: int


@dataclass(frozen=True, slots=True)
class IdemRecord:
    """An idempotency record. ``in_doubt`` is computed by ``idem_list`` only."""

    key: str
    operation: str
    status: str
    result: str | None
    result_ref: str | None
    error: str | None
    claim_token: str
    started_at: float
    completed_at: float | None
    trace_id: str | None
    job_id: int | None
    attempt: int | None
    in_doubt: bool = False


@dataclass(frozen=True, slots=True)
class CacheRecord:
    key: str
    base_key: str
    value: str
    version: int | None
    source_namespace: str | None
    source_key: str | None
    written_at: float
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    id: int
    event_id: str
    topic: str
    payload: str
    job_id: int | None
    trace_id: str | None
    created_at: float
    claimed_until: float | None
    attempts: int
    published_at: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class OutboxBacklog:
    pending: int
    oldest: float | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step of a job that committed (the step ledger), with the result it returned."""

    job_id: int
    step_key: str
    step_name: str
    attempt: int
    trace_id: str
    result: str | None
    result_ref: str | None
    completed_at: float


@dataclass(frozen=True, slots=True)
class Blob:
    codec: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LineageRecord:
    trace_id: str
    origin: str
    source_trace_id: str
    source_job_id: int | None
    branch: str | None
    details: str
    created_at: float


@dataclass(frozen=True, slots=True)
class GcScan:
    """Finished jobs past ``cutoff`` with an id above ``after``, at most ``limit``."""

    after: int
    cutoff: float
    limit: int


@dataclass(frozen=True, slots=True)
class GcCandidate:
    job_id: int
    job_type: str
    finished_at: float


@dataclass(frozen=True, slots=True)
class JobHour:
    """The aggregates tier: deleted jobs of one type, version, hour and final state."""

    job_type: str
    version: str
    hour: float
    state: str
    jobs: int
    attempts: int


@dataclass(frozen=True, slots=True)
class KeepRecord:
    job_id: int
    reason: str
    kept_at: float


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    name: str
    cron: str
    job_type: str
    timezone: str
    missed: str
    anchor: float
    last_slot: float | None
    last_job_id: int | None
    next_slot: float | None
    updated_at: float


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

    def close(self) -> None: ...


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Split ``items`` into slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def idem_get(tx: Transaction, key: str) -> IdemRecord | None:
    """The idempotency record of ``key``, if there is one."""
    found = tx.idem_list(IdemFilter(key=key))
    return found[0] if found else None
