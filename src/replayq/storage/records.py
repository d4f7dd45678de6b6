"""The records the storage verbs return, one field per column; never a mapping.

Imports: the foundations only.
"""

from __future__ import annotations

from msgspec import Struct


class JobGauge(Struct, frozen=True):
    """Open production jobs of one queue, type, version and state (``replayq metrics``)."""

    queue: str
    job_type: str
    version: str
    state: str
    count: int
    oldest_ready: float | None
    oldest_leased: float | None


class OrderBreak(Struct, frozen=True):
    """Production jobs of one queue, type and version run (or waiting) after an earlier job
    of their ordering key died or was cancelled (``replayq_jobs_out_of_order``)."""

    queue: str
    job_type: str
    version: str
    count: int


class SignalBucket(Struct, frozen=True):
    """How many events of ``name`` fell in one time bucket for a type and version."""

    bucket_ms: int
    job_type: str
    version: str | None
    name: str
    count: int


class VersionOutcome(Struct, frozen=True):
    """An attempt's end, a decision or an incident of a job, with the version that ran it."""

    job_id: int
    attempt: int | None
    name: str
    version: str | None
    error_class: str | None
    duration: float | None
    reason: str | None
    stale: bool | None


class ContractRecord(Struct, frozen=True):
    job_type: str
    version: str
    body: str
    registered_at: float


class RoutingRecord(Struct, frozen=True):
    job_type: str
    body: str
    revision: int
    updated_at: float


class RoutingEvent(Struct, frozen=True):
    id: int
    job_type: str
    revision: int
    action: str
    actor: str
    reason: str | None
    body: str
    ts: float


class Comparison(Struct, frozen=True):
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


class EntityRecord(Struct, frozen=True):
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


class Branch(Struct, frozen=True):
    branch: str
    base_branch: str
    base_hlc: int
    origin: str
    created_at: float


class Lock(Struct, frozen=True):
    """A lock row; ``owner_token is None`` when nobody holds it."""

    resource: str
    owner_token: str | None
    fencing_token: int
    job_id: int | None
    worker_id: str | None
    acquired_at: float | None
    expires_at: float | None
    hlc: int
    expired: bool = False
    """Held past ``expires_at`` (read by resource only: ``LockFilter(resource=...)``)."""


class LockGrant(Struct, frozen=True):
    fencing_token: int
    hlc: int


class IdemRecord(Struct, frozen=True):
    """An idempotency record. ``in_doubt`` is computed by ``idem_list`` only: listed, or
    one key's read with a lease's ``now`` (``idem_judged``)."""

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


class CacheRecord(Struct, frozen=True):
    key: str
    base_key: str
    value: str
    version: int | None
    source_namespace: str | None
    source_key: str | None
    written_at: float
    expires_at: float | None


class OutboxRecord(Struct, frozen=True):
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


class OutboxBacklog(Struct, frozen=True):
    pending: int
    oldest: float | None


class StepRecord(Struct, frozen=True):
    """A step of a job that committed (the step ledger), with the result it returned."""

    job_id: int
    step_key: str
    step_name: str
    attempt: int
    trace_id: str
    result: str | None
    result_ref: str | None
    completed_at: float


class Blob(Struct, frozen=True):
    codec: str
    body: bytes


class LineageRecord(Struct, frozen=True):
    trace_id: str
    origin: str
    source_trace_id: str
    source_job_id: int | None
    branch: str | None
    details: str
    created_at: float


class GcCandidate(Struct, frozen=True):
    job_id: int
    job_type: str
    version: str | None
    finished_at: float


class DerivedCandidate(Struct, frozen=True):
    """A derived trace gc may collect, with the type and version of the job it came from
    (``None``: that job is gone)."""

    trace_id: str
    origin: str
    source_job_id: int | None
    job_type: str | None
    version: str | None
    created_at: float


class BlobCandidate(Struct, frozen=True):
    hash: str
    stored_size: int


class JobHour(Struct, frozen=True):
    """The aggregates tier: deleted jobs of one type, version, hour and final state."""

    job_type: str
    version: str
    hour: float
    state: str
    jobs: int
    attempts: int


class KeepRecord(Struct, frozen=True):
    job_id: int
    reason: str
    kept_at: float


class ScheduleRecord(Struct, frozen=True):
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


GcAnswer = (
    list[KeepRecord]
    | list[GcCandidate]
    | int
    | list[JobHour]
    | list[DerivedCandidate]
    | list[BlobCandidate]
)
"""What ``gc_scan`` answers, by question."""
