"""The storage seam: a small protocol with noun-first verbs taking parameter dataclasses.

Domain code (queue, worker, context, replay) talks to a ``Storage`` and the
``Transaction`` objects it hands out; it never sees a driver. Every verb that
depends on time takes ``now`` from the caller's ``Clock``. Backends live in
``storage/sqlite/`` and ``storage/postgres/`` and pass one conformance suite.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from replayq.model import Job, StatRow, TraceEvent

Row = dict[str, Any]


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class LeaseExtend:
    job_id: int
    owner_token: str
    now: float
    lease_seconds: float


@dataclass(frozen=True)
class JobComplete:
    job_id: int
    owner_token: str
    now: float
    result_json: str | None
    hlc: int


@dataclass(frozen=True)
class JobRetry:
    job_id: int
    owner_token: str
    now: float
    run_at: float
    error_class: str
    error: str
    hlc: int


@dataclass(frozen=True)
class JobBury:
    """Move a job to ``dead``. ``owner_token=None`` buries regardless of owner (reaper, admin)."""

    job_id: int
    owner_token: str | None
    now: float
    reason: str
    error_class: str | None
    error: str | None
    hlc: int


@dataclass(frozen=True)
class JobFilter:
    states: Sequence[str] | None = None
    job_type: str | None = None
    origin: str | None = "production"
    limit: int = 100
    # Only jobs routed to this handler version (``jobs list --version``).
    version: str | None = None
    # Keyset pagination: only jobs with a smaller id (the last id of the page before).
    before: int | None = None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: float | None


class Transaction(Protocol):
    """The verbs, all inside one database transaction."""

    connection: Any
    """The driver connection the transaction runs on (for ``ctx.db_write``)."""

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

    def lease_extend(self, params: LeaseExtend) -> bool:
        """Compare-and-set on (job id, owner token); ``False`` when the lease is lost."""
        ...

    def job_complete(self, params: JobComplete) -> bool: ...

    def job_retry(self, params: JobRetry) -> bool: ...

    def job_bury(self, params: JobBury) -> bool: ...

    def job_cancel(self, job_id: int, now: float, hlc: int) -> bool: ...

    def job_cancel_request(self, job_id: int, now: float, hlc: int) -> bool:
        """Ask a running job to stop; ``False`` if it is not running (or already asked)."""
        ...

    def job_cancel_requested(self, worker_id: str) -> set[int]:
        """Which of this worker's running jobs were asked to stop."""
        ...

    def job_cancel_running(self, job_id: int, owner_token: str, now: float, hlc: int) -> bool:
        """End a running job that was asked to stop as ``cancelled`` (CAS on the owner)."""
        ...

    def job_requeue(
        self,
        job_id: int,
        now: float,
        hlc: int,
        extra_attempts: int = 1,
        to_version: str | None = None,
    ) -> bool:
        """Move a ``dead`` job back to ``queued`` with a fresh attempt budget.

        Its version is ``to_version``, or chosen afresh at its next lease when ``None``.
        """
        ...

    def lease_reap(self, now: float, limit: int) -> list[Job]:
        """Jobs whose lease expired, as they were before this call; the caller re-queues them."""
        ...

    def lease_release(self, job_id: int, owner_token: str, now: float, hlc: int) -> bool:
        """Give a running job back to the queue (shutdown): one more attempt in its budget.

        The attempt number is kept, so the next run is a new attempt whose events never
        collide with the released run's (outbox event ids are per step position, not per
        attempt: a step the released run committed is not published twice).
        """
        ...

    def job_redeliver(self, job_id: int, owner_token: str, now: float, hlc: int) -> bool:
        """Re-queue a job whose lease expired; compare-and-set on the expired owner token."""
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

    def job_scheduled(self, now: float, queues: Sequence[str] | None) -> tuple[int, float | None]:
        """Queued jobs not due yet (delayed or backing off): ``(count, first run_at)``."""
        ...

    def job_stats(self) -> list[StatRow]: ...

    def job_gauges(self, now: float) -> list[Row]:
        """Open jobs (queued, running, dead) counted by queue, type, version and state,
        with ``oldest_ready`` (the earliest ``run_at`` due by ``now``) and ``oldest_leased``."""
        ...

    def job_out_of_order(self) -> list[Row]:
        """Jobs run (or waiting) after an earlier job of their ordering key died or was
        cancelled, counted by ``queue``, ``job_type`` and ``version``."""
        ...

    def job_durations(self, job_type: str, version: str | None) -> list[float]: ...

    def signal_counts(self, names: Sequence[str], since: float) -> list[tuple[str, str, int]]: ...

    def trace_append(self, events: Sequence[TraceEvent]) -> None: ...

    def trace_window(self, params: TraceWindow) -> list[tuple[TraceEvent, str, str | None]]:
        """``(event, job type, version)`` in HLC order: a page of a time window."""
        ...

    def signal_series(
        self, names: Sequence[str], since_hlc: int, until_hlc: int, bucket_ms: int
    ) -> list[Row]:
        """Counts of the named events per time bucket, job type, version and name."""
        ...

    def trace_for_job(self, job_id: int) -> list[TraceEvent]: ...

    def trace_for_trace(self, trace_id: str) -> list[TraceEvent]: ...

    def trace_for_resource(self, resource: str) -> list[TraceEvent]:
        """Events on ``resource`` or on its versioned keys (``resource:v<N>``), in HLC order."""
        ...

    def contract_put(self, job_type: str, version: str, body_json: str, now: float) -> None: ...

    def contract_get(self, job_type: str, version: str) -> str | None: ...

    def contract_list(self, job_type: str | None) -> list[tuple[str, str, str, float]]: ...

    def contract_activate(self, job_type: str, version: str, now: float) -> None:
        """Record ``version`` as the one new jobs of ``job_type`` run under."""
        ...

    def contract_active(self, job_type: str) -> str | None: ...

    # Rollouts: routing records, a job's version chosen at its first lease, comparisons.

    def routing_get(self, job_type: str) -> Row | None:
        """``{job_type, body, revision, updated_at}`` of the type's routing, if it has one."""
        ...

    def routing_list(self) -> list[Row]: ...

    def routing_put(self, params: RoutingPut) -> int | None:
        """The new revision, or ``None`` when the record changed since it was read."""
        ...

    def routing_events(self, job_type: str) -> list[Row]:
        """Every change of the type's routing, oldest first, with actor and reason."""
        ...

    def job_route(self, job_id: int, owner_token: str, version: str) -> bool:
        """Set the version of a job this owner just leased, if it has none yet."""
        ...

    def job_reroute(self, job_type: str, from_version: str, to_version: str) -> int:
        """Move queued jobs of a type from one version to another; returns how many."""
        ...

    def comparison_put(self, params: Mapping[str, Any]) -> None: ...

    def comparison_list(self, job_type: str, mode: str | None, limit: int) -> list[Row]: ...

    def version_outcomes(self, job_type: str, since: float) -> list[Row]:
        """Attempt ends, decisions and incidents of a type since ``since``, with the version."""
        ...

    # The recording context's verbs (rows as dicts; see storage/context_verbs.py).

    def entity_head(self, branch: str, namespace: str, key: str) -> Row | None: ...

    def entity_version_get(
        self, branch: str, namespace: str, key: str, version: int
    ) -> Row | None: ...

    def entity_version_at(self, branch: str, namespace: str, key: str, hlc: int) -> Row | None: ...

    def entity_put(self, row: Mapping[str, Any], expected_version: int) -> bool: ...

    def entity_history(self, branch: str, namespace: str, key: str) -> list[Row]: ...

    def entity_version_insert(self, row: Mapping[str, Any]) -> None: ...

    def job_set_recorded(
        self, job_id: int, handler_version: str | None, result_json: str, attempt: int
    ) -> None: ...

    def entity_versions_by_job(self, job_id: int) -> list[Row]: ...

    def entity_versions_after(
        self, branch: str, namespace: str, key: str, version: int
    ) -> list[Row]: ...

    def branch_create(
        self, branch: str, base_branch: str, base_hlc: int, origin: str, now: float
    ) -> None: ...

    def branch_get(self, branch: str) -> Row | None: ...

    def branch_entities(self, branch: str) -> list[Row]: ...

    def lock_acquire(self, params: Mapping[str, Any]) -> Row | None: ...

    def lock_get(self, resource: str) -> Row | None: ...

    def lock_renew(self, resource: str, owner_token: str, now: float, ttl: float) -> bool: ...

    def lock_release(self, resource: str, owner_token: str, hlc: int) -> bool: ...

    def lock_list(self) -> list[Row]: ...

    def lock_break(self, resource: str, hlc: int) -> Row | None: ...

    def fence_current(self, resource: str) -> int | None: ...

    def idem_claim(self, params: Mapping[str, Any]) -> bool: ...

    def idem_get(self, key: str) -> Row | None: ...

    def idem_takeover(self, params: Mapping[str, Any]) -> bool: ...

    def idem_succeed(self, params: Mapping[str, Any]) -> bool: ...

    def idem_fail(self, params: Mapping[str, Any]) -> bool: ...

    def idem_compensate(self, key: str, now: float) -> bool: ...

    def idem_by_job(self, job_id: int) -> list[Row]: ...

    def idem_list(self, operation: str | None, in_doubt: bool, limit: int) -> list[Row]:
        """Effect records, newest first; ``in_doubt``: only ``started`` by a finished attempt."""
        ...

    def idem_resolve(self, params: Mapping[str, Any]) -> bool:
        """Settle an in-doubt record: compare-and-set on ``status = 'started'`` and its claim."""
        ...

    def cache_put(self, params: Mapping[str, Any]) -> None: ...

    def cache_get(self, key: str, now: float) -> Row | None: ...

    def cache_latest(self, base_key: str, now: float) -> Row | None: ...

    def cache_delete_base(self, base_key: str) -> None: ...

    def cache_delete_source(self, namespace: str, key: str) -> None: ...

    def outbox_insert(self, params: Mapping[str, Any]) -> bool:
        """Insert an outbox row; ``False`` (nothing written) when its ``event_id`` exists."""
        ...

    def outbox_claim(self, now: float, claim_seconds: float, limit: int) -> list[Row]: ...

    def outbox_mark_published(self, row_id: int, now: float) -> bool: ...

    def outbox_mark_failed(self, row_id: int, error: str) -> bool: ...

    def outbox_backlog(self) -> Row: ...

    def outbox_by_job(self, job_id: int) -> list[Row]: ...

    def step_complete(self, params: Mapping[str, Any]) -> bool:
        """Record that a step of a job committed, with its result; first completion wins."""
        ...

    def step_by_job(self, job_id: int) -> list[Row]:
        """The job's committed steps (the step ledger), oldest attempt first."""
        ...

    def blob_put(self, params: Mapping[str, Any]) -> None: ...

    def blob_get(self, digest: str) -> Row | None: ...

    def lineage_put(self, params: Mapping[str, Any]) -> None: ...

    def lineage_get(self, trace_id: str) -> Row | None: ...

    def lineage_for_source(self, source_trace_id: str) -> list[Row]: ...

    def lineage_page(self, after: tuple[float, str], limit: int) -> list[Row]:
        """Derived traces created after the ``(created_at, trace_id)`` cursor, oldest first."""
        ...

    def schedule_register(self, params: Mapping[str, Any]) -> None:
        """Store a periodic job's declaration; a new one is anchored at ``now``."""
        ...

    def schedule_get(self, name: str) -> Row | None: ...

    def schedule_advance(self, params: Mapping[str, Any]) -> bool:
        """Compare-and-set of a schedule's anchor (the newest decided slot); ``False`` if moved."""
        ...

    def schedule_made(self, name: str, slot: float, job_id: int) -> None:
        """Note the newest slot a schedule enqueued and the job it made."""
        ...

    def schedule_list(self) -> list[Row]: ...


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
