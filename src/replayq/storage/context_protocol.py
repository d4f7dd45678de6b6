"""The recording context's verbs of the storage seam, and the schedules' verbs.

State, locks, effects (idempotency records), cache, outbox, steps, blobs, lineage and
schedules. Part of ``Transaction`` (``protocol.py``); implemented once in
``context_verbs.ContextVerbs``, with the parameter structs of ``context_params.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, overload

from replayq.storage.context_params import (
    BlobPut,
    BranchCreate,
    CacheChange,
    CacheLookup,
    EntityFilter,
    EntityGet,
    IdemChange,
    IdemFilter,
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
    ScheduleChange,
    StepComplete,
)
from replayq.storage.records import (
    Blob,
    Branch,
    CacheRecord,
    EntityRecord,
    IdemRecord,
    LineageRecord,
    Lock,
    LockGrant,
    OutboxRecord,
    ScheduleRecord,
    StepRecord,
)


class ContextTransaction(Protocol):
    """The verbs of a ``Transaction`` that the recording context and the schedules use."""

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
