"""The parameters the storage verbs take: one frozen struct per question or change.

A verb that changes one job takes one of the ``JobChange`` union (``job_transition``);
a reader of many kinds takes one of a union of queries (``JobQuery``, ``TraceRead``,
``RolloutQuery``) and answers each with its own record. The recording context's
parameters are in ``context_params.py``, the reports' in ``reports.py``.
Imports: the foundations only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct, field

from replayq.model import TraceEvent


class JobInsert(Struct, frozen=True):
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


class JobLease(Struct, frozen=True):
    """Claim up to ``limit`` jobs; each gets the lease (and handler version) of its type.

    ``now`` decides which jobs are due (``run_at``). The lease itself (``leased_at``,
    ``lease_deadline``) is granted in ``now`` too, unless ``database_clock``: then in
    the database's own time, the one clock every worker's leases are judged by.
    """

    worker_id: str
    owner_token: str
    now: float
    hlc: int
    limit: int
    default_lease_seconds: float
    lease_for: Mapping[str, float] = field(default_factory=dict)
    version_for: Mapping[str, str] = field(default_factory=dict)
    queues: Sequence[str] | None = None
    database_clock: bool = False
    # Only jobs of these types (``None``: of any): a worker leasing ahead of its free
    # executors leaves out the types whose lease is a fixed visibility timeout.
    job_types: Sequence[str] | None = None
    # Not these jobs (``None``: none passed over): a worker's first lease after a job's
    # start raised there passes over that job, so that it tries another one in between
    # (``Executing._unstartable``): given back, the job is first in the queue again.
    skip_ids: Sequence[int] | None = None
    # A claim that collides with another claimer's on an ordering key (PostgreSQL's
    # one-running-per-key index) may abort the whole transaction: ``job_lease`` raises
    # ``LeaseCollisionError`` and the caller does the transaction again. Otherwise, after
    # the transaction's earlier statements, the claim runs in a savepoint of its own (two
    # more round trips) so that a collision undoes it alone.
    collision_aborts: bool = False


class LeasesExtend(Struct, frozen=True):
    """One heartbeat for every lease a worker holds, in one statement: each lease ends
    its own ``seconds`` after ``now`` (after the database's own now with
    ``database_clock``). ``lease_extend`` answers the ids of the leases still held;
    a lease missing from the answer was lost."""

    # (job id, owner token, lease seconds) of each lease.
    leases: tuple[tuple[int, str, float], ...]
    now: float
    database_clock: bool = False


class JobsComplete(Struct, frozen=True):
    """Successes acked together (``jobs_complete``): each ``(job id, owner token, result
    JSON, hlc)`` row succeeds while its owner token holds the job; all finish at ``now``."""

    now: float
    jobs: Sequence[tuple[int, str, str | None, int]]
    # Whether a job of ``jobs`` has an ordering key: its ack can make the next job of its
    # key ready (the commit then wakes this process's idle workers). ``None``: not known,
    # the statement returns each acked job's key (SQLite needs it only then).
    ordered: bool | None = None


class JobRetry(Struct, frozen=True):
    job_id: int
    owner_token: str
    now: float
    run_at: float
    error_class: str
    error: str
    hlc: int


class JobBury(Struct, frozen=True):
    """Move a running job to ``dead`` (CAS on its owner); ``owner_token=None``: a queued one."""

    job_id: int
    owner_token: str | None
    now: float
    reason: str
    error_class: str | None
    error: str | None
    hlc: int


class JobFilter(Struct, frozen=True):
    states: Sequence[str] | None = None
    job_type: str | None = None
    origin: str | None = "production"
    limit: int = 100
    # Only jobs routed to this handler version (``jobs list --version``).
    version: str | None = None
    # Keyset pagination: only jobs with a smaller id (the last id of the page before).
    before: int | None = None


class CancelRequested(Struct, frozen=True):
    """The running jobs of ``worker_id`` that were asked to stop (its heartbeat's question)."""

    worker_id: str


class LeasesExpired(Struct, frozen=True):
    """Running jobs whose lease ended before ``now``, soonest expired first, as they are
    before the reaper re-queues them (PostgreSQL skips rows another transaction holds).

    With ``database_clock``: ended before the database's own now instead, the clock
    ``JobLease`` and ``LeasesExtend`` granted the leases in when they had it.
    """

    now: float
    limit: int
    database_clock: bool = False


JobQuery = JobFilter | CancelRequested | LeasesExpired
"""What ``job_list`` reads; each kind has its own index-backed query."""


class JobMatch(Struct, frozen=True):
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


class TraceWindow(Struct, frozen=True):
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


class MigrationStatus(Struct, frozen=True):
    version: int
    name: str
    applied_at: float | None


# -- parameters of the queue's transitions (one verb: ``job_transition``) ----------------------


class JobCancel(Struct, frozen=True):
    """Cancel a job that is still ``queued`` (a running one is asked: ``JobCancelRequest``)."""

    job_id: int
    now: float
    hlc: int


class JobCancelRequest(Struct, frozen=True):
    """Ask a running job to stop; fails if it is not running (or was already asked)."""

    job_id: int
    now: float
    hlc: int


class JobCancelRunning(Struct, frozen=True):
    """End a running job that was asked to stop as ``cancelled`` (CAS on the owner)."""

    job_id: int
    owner_token: str
    now: float
    hlc: int


class JobReleaseRunning(Struct, frozen=True):
    """Give a running job that was asked to stop back to the queue on ``to_version``.

    The release of ``rollout rollback --release-inflight``: a CAS on the owner, the
    attempt number kept and one more in the budget (as ``LeaseRelease``).
    """

    job_id: int
    owner_token: str
    to_version: str
    now: float
    hlc: int


class JobRequeue(Struct, frozen=True):
    """Move a ``dead`` job back to ``queued`` with a fresh attempt budget.

    Its version is ``to_version``, or chosen afresh at its next lease when ``None``.
    """

    job_id: int
    now: float
    hlc: int
    extra_attempts: int = 1
    to_version: str | None = None


class LeaseRelease(Struct, frozen=True):
    """Give a running job back to the queue (shutdown): one more attempt in its budget.

    The attempt number is kept, so the next run is a new attempt whose events never
    collide with the released run's (outbox event ids are per step position, not per
    attempt: a step the released run committed is not published twice).
    """

    job_id: int
    owner_token: str
    now: float
    hlc: int
    # False: the job was leased ahead and never started. It goes back as if never
    # leased: its attempt number and budget as they were, its place in the queue kept.
    started: bool = True


class JobRedeliver(Struct, frozen=True):
    """Re-queue a job whose lease expired; compare-and-set on the expired owner token."""

    job_id: int
    owner_token: str
    now: float
    hlc: int


class JobRoute(Struct, frozen=True):
    """Set the version of a running job this owner holds: leased without one, or with one
    its routing no longer names (the worker decides; the row is a CAS on the owner)."""

    job_id: int
    owner_token: str
    version: str


class JobSetRecorded(Struct, frozen=True):
    """Mark an imported regression-case job as it was recorded."""

    job_id: int
    handler_version: str | None
    result_json: str
    attempt: int


JobChange = (
    JobRetry
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


class JobReroute(Struct, frozen=True):
    """Move the queued jobs of a type from one version to another: the one change of many
    job rows, so ``job_transition`` answers it with how many moved, not a ``bool``."""

    job_type: str
    from_version: str
    to_version: str


class TraceQuery(Struct, frozen=True):
    """Which events ``trace_query`` reads: exactly one of the three filters is set.

    ``job_id``: the job's events in HLC order; ``trace_id``: one trace's events;
    ``resource``: events on the resource or on its versioned keys (``resource:v<N>``),
    in HLC order, across jobs and workers.
    """

    job_id: int | None = None
    trace_id: str | None = None
    resource: str | None = None


class TraceJobs(Struct, frozen=True):
    """Several jobs' events, all in one query (a bulk dry-run's batch): one ``JobTrace``
    per job that has events, in no particular order of jobs.

    ``enqueued=False`` may leave out each job's ``job.enqueued`` (attempt 0), which a
    replay never reads: SQLite keeps it in the job's row, and reading it there was a
    second lookup, a row and a decoded event a job. A backend that stores it as one of
    the job's packs returns it anyway."""

    job_ids: Sequence[int]
    enqueued: bool = True


class JobTrace(Struct, frozen=True):
    """One job's events as ``trace_query(TraceJobs(...))`` returns them: in HLC order."""

    job_id: int
    events: list[TraceEvent]


TraceRead = TraceQuery | TraceJobs | TraceWindow
"""What ``trace_query`` reads; each kind answers with its own record (see its overloads)."""


# -- parameters of the rollout verbs (``rollout_query``, ``rollout_update``) ----------------------


class ContractQuery(Struct, frozen=True):
    """Stored contracts, of one type (and one version of it) when given."""

    job_type: str | None = None
    version: str | None = None


class ActiveVersion(Struct, frozen=True):
    """The version new jobs of ``job_type`` run under (``ContractActivate``), if any."""

    job_type: str


class RoutingQuery(Struct, frozen=True):
    """Every type's routing record, or the one of ``job_type`` (if it has one)."""

    job_type: str | None = None


class RoutingHistory(Struct, frozen=True):
    """Every change of the type's routing, oldest first, with actor and reason."""

    job_type: str


class ComparisonQuery(Struct, frozen=True):
    """The newest ``limit`` comparisons of a type, of one ``mode`` when given."""

    job_type: str
    mode: str | None = None
    limit: int = 100


RolloutQuery = ContractQuery | ActiveVersion | RoutingQuery | RoutingHistory | ComparisonQuery
"""What ``rollout_query`` reads; each kind answers with its own record (see its overloads)."""


class ContractPut(Struct, frozen=True):
    """Store (or replace) the contract of one version of a type."""

    job_type: str
    version: str
    body_json: str
    now: float


class ContractActivate(Struct, frozen=True):
    """Record ``version`` as the one new jobs of ``job_type`` run under."""

    job_type: str
    version: str
    now: float


class RoutingPut(Struct, frozen=True):
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


class ComparisonPut(Struct, frozen=True):
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


RolloutChange = ContractPut | ContractActivate | RoutingPut | ComparisonPut
"""Every rollout write: ``rollout_update`` answers ``RoutingPut`` with the new revision
(``None``: the record changed since it was read) and the others with ``None``."""
