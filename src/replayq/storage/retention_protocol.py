"""The retention verbs of the storage seam: ``keep_transition``, ``gc_scan``, ``gc_apply``.

Part of ``Transaction`` (``protocol.py``); implemented once in
``retention_verbs.RetentionVerbs``, with the parameter structs of ``retention_params.py``.
"""

from __future__ import annotations

from typing import Protocol, overload

from replayq.storage.records import (
    BlobCandidate,
    DerivedCandidate,
    GcAnswer,
    GcCandidate,
    JobHour,
    KeepRecord,
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


class RetentionTransaction(Protocol):
    """The retention verbs of a ``Transaction``: pins and holds, gc's questions and its
    deletions."""

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
