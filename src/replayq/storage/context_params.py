"""The parameters of the recording context's storage verbs: state, locks, effects, cache,
outbox, blobs, lineage and schedules (implemented in ``context_verbs.py``).

Each noun has at most one writer taking a union of changes (``LockChange``,
``IdemChange``, ``CacheChange``, ``OutboxChange``, ``ScheduleChange``) and one or two
readers. Imports: the foundations only.
"""

from __future__ import annotations

import math

from msgspec import Struct


class EntityGet(Struct, frozen=True):
    """One version of an entity: the head (neither filter), ``version``, or the newest
    written at or before ``at_hlc``."""

    branch: str
    namespace: str
    key: str
    version: int | None = None
    at_hlc: int | None = None


class EntityFilter(Struct, frozen=True):
    """Versions written by ``job_id`` (HLC order), or of one entity after ``after_version``."""

    job_id: int | None = None
    branch: str | None = None
    namespace: str | None = None
    key: str | None = None
    after_version: int = 0


class BranchCreate(Struct, frozen=True):
    branch: str
    base_branch: str
    base_hlc: int
    origin: str
    now: float


class LockAcquire(Struct, frozen=True):
    """Take the lock if free or expired: its new fencing token and HLC, else ``None``."""

    resource: str
    owner_token: str
    job_id: int | None
    worker_id: str | None
    now: float
    ttl: float
    hlc: int
    database_clock: bool = False
    """Judge and grant the TTL in the database's clock, not ``now``
    (``Runtime.leases_by_database``)."""
    wait: float | None = None
    """How long, in seconds, the acquisition's statements may wait for a row lock (the
    lock's row held ``FOR SHARE`` by a commit fencing a write under it; the job's row):
    past it, ``RowLockTimeoutError`` and nothing granted. ``None``: no bound. PostgreSQL
    only (``lock_timeout``, local to the acquisition's transaction); on SQLite, where an
    acquisition waits for the database's write lock instead, it changes nothing."""


class LockRenew(Struct, frozen=True):
    """Extend a lock ``owner_token`` holds by ``ttl`` from ``now``; ``False`` if it does not."""

    resource: str
    owner_token: str
    now: float
    ttl: float
    database_clock: bool = False
    wait: float | None = None
    """How long, in seconds, the renewal may wait for the lock's row (``LockAcquire.wait``):
    past it ``RowLockTimeoutError``, nothing renewed. ``None``: no bound."""


class LockRelease(Struct, frozen=True):
    """Free a lock held by ``owner_token``; ``owner_token=None`` breaks it whoever holds it,
    and bumps the fencing token so the old holder's later writes are refused.

    Answered with the lock as left, or ``None`` when it was not held (by that owner).
    """

    resource: str
    owner_token: str | None
    hlc: int
    wait: float | None = None
    """How long, in seconds, the release or break may wait for the lock's row
    (``LockAcquire.wait``): past it ``RowLockTimeoutError``, nothing changed. ``None``: no
    bound."""


class LockReleaseInTime(Struct, frozen=True):
    """Free a lock ``owner_token`` holds whose lease has not run out (judged like its
    acquisition, in ``now`` or the database's clock): ``True``, or ``False`` when it was not
    held by that owner or its lease ran out, and nothing changed.

    A holder's release in one statement: the answer is all ``lock.released`` needs. On
    ``False`` the holder releases it with ``LockRelease`` and records ``lock.expired``. In
    a ``pipelined(refusals=True)`` block on PostgreSQL it is sent unread and answers
    ``True``: had it changed nothing, the block fails (``CommitRefused``)."""

    resource: str
    owner_token: str
    now: float
    hlc: int
    database_clock: bool = False
    wait: float | None = None
    """As ``LockRelease.wait``. ``None`` for a release a step's commit makes after the writes
    it guarded: that commit holds the row already (its fence), and waits for no one."""


LockChange = LockAcquire | LockRenew | LockRelease | LockReleaseInTime
"""Every compare-and-set on one lock row: ``lock_transition`` answers each with its record."""

# ``lock_timeout``'s largest value (an ``int`` of milliseconds in PostgreSQL).
LOCK_TIMEOUT_MAX_MS = 2_147_483_647


def lock_timeout_ms(wait: float) -> int:
    """A lock change's ``wait`` as PostgreSQL's ``lock_timeout``: whole milliseconds, at
    least one (``0`` would mean no bound at all), at most what the setting holds (a longer
    ``wait`` is bounded by its caller's own loop). ``math.inf`` (``break_lock(wait=)``: as
    long as it takes) is that most, not ``OverflowError``."""
    if not wait * 1000 < LOCK_TIMEOUT_MAX_MS:
        return LOCK_TIMEOUT_MAX_MS
    return max(1, math.ceil(wait * 1000))


class LockFilter(Struct, frozen=True):
    """The lock row of ``resource`` (held or not: its holder and fencing token), or, with
    no ``resource``, every lock currently held."""

    resource: str | None = None
    now: float | None = None
    """Whether the lock of ``resource`` has ``expired`` is judged in ``now``, or when ``None``
    in the database's clock."""
    newer_than: int | None = None
    """With ``resource``: its lock row only if its fencing token is newer than this one (a
    write fenced by this token is stale), else none. The row stays as read until the
    transaction ends (PostgreSQL: ``FOR SHARE``; SQLite's write transaction holds the
    database's write lock): the lock is not taken again before the write commits. In a
    ``pipelined(refusals=True)`` block on PostgreSQL the question is sent unread, and it
    answers none: had the token moved on, the block fails (``CommitRefused``)."""


class IdemClaim(Struct, frozen=True):
    """Claim a business key before its side effect runs; fails when the key exists."""

    key: str
    operation: str
    claim_token: str
    now: float
    trace_id: str | None
    job_id: int | None
    attempt: int | None


class IdemTakeover(Struct, frozen=True):
    """Claim again a record left ``expected_status`` by ``expected_claim``."""

    key: str
    claim_token: str
    now: float
    trace_id: str | None
    job_id: int | None
    attempt: int | None
    expected_status: str
    expected_claim: str


class IdemSucceed(Struct, frozen=True):
    key: str
    claim_token: str
    result: str | None
    result_ref: str | None
    now: float


class IdemFail(Struct, frozen=True):
    key: str
    claim_token: str
    error: str
    now: float


class IdemCompensate(Struct, frozen=True):
    """A ``succeeded`` record whose effect was reversed (rollback)."""

    key: str
    now: float


class IdemResolve(Struct, frozen=True):
    """Settle an in-doubt record: compare-and-set on ``status = 'started'`` and its claim."""

    key: str
    claim_token: str
    status: str
    result: str | None
    error: str | None
    now: float


IdemChange = IdemClaim | IdemTakeover | IdemSucceed | IdemFail | IdemCompensate | IdemResolve
"""Every write of an idempotency record: ``idem_transition`` returns whether it applied."""


class IdemFilter(Struct, frozen=True):
    """Effect records by ``key``, by ``job_id`` (oldest first), or newest first by
    ``operation``; ``in_doubt``: only ``started`` by an attempt that no longer runs.

    ``key`` with ``now``: the record with ``in_doubt`` judged as a claim must judge it
    (``idem_judged``): ``started`` and its attempt not running under a lease that has not
    ended by ``now``, or by the database's own now with ``database_clock``
    (``Runtime.leases_by_database``), as the reaper judges leases."""

    key: str | None = None
    job_id: int | None = None
    operation: str | None = None
    in_doubt: bool = False
    limit: int = 100
    now: float | None = None
    database_clock: bool = False


class CachePut(Struct, frozen=True):
    key: str
    base_key: str
    value: str
    version: int | None
    source_namespace: str | None
    source_key: str | None
    now: float
    expires_at: float | None


class CacheLookup(Struct, frozen=True):
    """An unexpired entry by ``key``, or the newest one of ``base_key``."""

    now: float
    key: str | None = None
    base_key: str | None = None


class CacheDelete(Struct, frozen=True):
    """Drop the entries of ``base_key``, or those derived from entity ``namespace``/``key``."""

    base_key: str | None = None
    namespace: str | None = None
    key: str | None = None


CacheChange = CachePut | CacheDelete
"""Every write of the cache table (``cache_update``)."""


class OutboxInsert(Struct, frozen=True):
    event_id: str
    topic: str
    payload: str
    job_id: int | None
    trace_id: str | None
    now: float


class OutboxMark(Struct, frozen=True):
    """A claimed row published (``error is None``) or failed with ``error``."""

    row_id: int
    now: float
    error: str | None = None


OutboxChange = OutboxInsert | OutboxMark
"""Every write of one outbox row: ``outbox_update`` returns whether it applied (an insert
whose ``event_id`` exists writes nothing)."""


class OutboxClaim(Struct, frozen=True):
    """Claim up to ``limit`` unpublished rows for ``claim_seconds`` (the relay's batch)."""

    now: float
    claim_seconds: float
    limit: int


class StepComplete(Struct, frozen=True):
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


class TraceFence(Struct, frozen=True):
    """The lease that must still be held for ``trace_append`` to write: the events go in
    only if ``owner_token`` holds job ``job_id``'s lease, checked in the statement that
    writes them (the fence of a step's commit, an effect's claim and result)."""

    job_id: int
    owner_token: str


class BlobPut(Struct, frozen=True):
    # The SHA-256 in hex, as a reference names it; stored as its 32 bytes (migration 0026).
    hash: str
    codec: str
    size: int
    stored_size: int
    body: bytes | bytearray
    now: float


class LineagePut(Struct, frozen=True):
    trace_id: str
    origin: str
    source_trace_id: str
    source_job_id: int | None
    branch: str | None
    details: str
    now: float


class LineageQuery(Struct, frozen=True):
    """Where ``trace_id`` came from, every trace derived from ``source_trace_id``, or (with
    ``after``, a ``(created_at, trace_id)`` cursor) the next ``limit`` derived traces,
    oldest first. With none of them: every derived trace."""

    trace_id: str | None = None
    source_trace_id: str | None = None
    after: tuple[float, str] | None = None
    limit: int = 1000


class ScheduleRegister(Struct, frozen=True):
    """Store a periodic job's declaration; a new one is anchored at ``now``."""

    name: str
    cron: str
    job_type: str
    timezone: str
    missed: str
    next_slot: float | None
    now: float


class ScheduleAdvance(Struct, frozen=True):
    """Compare-and-set of a schedule's anchor (the newest decided slot)."""

    name: str
    expected_anchor: float
    anchor: float
    next_slot: float | None
    now: float


class ScheduleMade(Struct, frozen=True):
    """Note the newest slot a schedule enqueued and the job it made."""

    name: str
    last_slot: float
    last_job_id: int


ScheduleChange = ScheduleRegister | ScheduleAdvance | ScheduleMade
