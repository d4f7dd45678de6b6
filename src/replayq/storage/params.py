"""The parameters the storage verbs take: one frozen dataclass per question or change.

A verb that changes one job takes one of the ``JobChange`` union (``job_transition``);
an idempotency record, one of ``IdemChange``; a schedule, one of ``ScheduleChange``.
Imports: the foundations only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from replayq.model import TraceEvent


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
class StepComplete:
    """A step of a job committed at position ``step_key`` with its result (the step
    ledger, ``rq_steps``): ``result`` is its JSON text, or ``None`` and ``result_ref``
    names the blob holding it."""

    job_id: int
    step_key: str
    step_name: str
    attempt: int
    trace_id: str
    result: str | None
    result_ref: str | None
    now: float


@dataclass(frozen=True, slots=True)
class TraceFence:
    """The lease that must still be held for ``trace_append`` to write: the events go in
    only if ``owner_token`` holds job ``job_id``'s lease, checked in the statement that
    writes them (the fence of a step's commit, an effect's claim and result)."""

    job_id: int
    owner_token: str


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


@dataclass(frozen=True, slots=True)
class GcScan:
    """Finished jobs past ``cutoff`` with an id above ``after``, at most ``limit``."""

    after: int
    cutoff: float
    limit: int
