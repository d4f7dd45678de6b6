"""The parameters of the retention verbs: ``keep_transition``, ``gc_scan``, ``gc_apply``.

Imports: the foundations only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from msgspec import Struct, field

from replayq.model import TraceEvent


class KeepPin(Struct, frozen=True):
    """Pin a job: gc never collects it (``replayq keep JOB --reason``)."""

    job_id: int
    reason: str
    now: float


class KeepHold(Struct, frozen=True):
    """A live fork, dry-run or verification holds the job it runs from until it releases
    the hold or ``expires_at``: gc neither trims nor deletes the job, nor collects its
    derived traces, meanwhile. Applies (``True``) only if the job exists."""

    holder: str
    job_id: int
    expires_at: float


class KeepRelease(Struct, frozen=True):
    holder: str


KeepChange = KeepPin | KeepHold | KeepRelease
"""Every write of a pin or a hold: ``keep_transition`` returns whether it applied."""


class KeptJobs(Struct, frozen=True):
    """The pinned jobs (``KeepRecord``), by id."""


class GcScan(Struct, frozen=True):
    """Finished jobs past ``cutoff`` with an id above ``after`` and at most ``until``, at
    most ``limit`` of them (``GcCandidate``): never a pinned one, nor one held at ``now``,
    nor one a derived trace came from on or after ``cutoff``. The id window keeps the
    plan an index range scan without statistics (PostgreSQL scanned every job for it)."""

    after: int
    until: int
    cutoff: float
    limit: int
    now: float


class GcCursor(Struct, frozen=True):
    """The last job id the gc pass ``name`` finished with (0: from the start)."""

    name: str


class GcHighestId(Struct, frozen=True):
    """The highest job id there is (0: none): where a gc pass's walk ends."""


class JobHours(Struct, frozen=True):
    """The aggregates of the jobs gc deleted (``JobHour``), oldest hour first."""

    job_type: str | None = None


class DerivedScan(Struct, frozen=True):
    """Derived traces (replays, forks, verifications) created before ``cutoff``, after the
    ``(created_at, trace_id)`` cursor, at most ``limit`` (``DerivedCandidate``): never one
    whose source job is pinned or held at ``now``."""

    after: tuple[float, str]
    cutoff: float
    limit: int
    now: float


class BlobScan(Struct, frozen=True):
    """Blobs nobody stored since ``before`` that no trace event, state version, step or
    idempotency record references, by hash above ``after``, at most ``limit``
    (``BlobCandidate``). Hashes in hex, as references name them (``""``: from the
    first); stored as their bytes (migration 0026), in the same order."""

    after: str
    before: float
    limit: int


GcQuery = KeptJobs | GcScan | GcCursor | GcHighestId | JobHours | DerivedScan | BlobScan
"""Every question gc asks: ``gc_scan`` answers each with its records (a cursor: an int)."""


class TraceTrim(Struct, frozen=True):
    """Rewrite these jobs' trace packs with what ``keep`` returns of each job's events (a
    subset, an event possibly with other data; a pack left empty is deleted, with its
    resource index entries). A job is skipped when it is not finished any more, pinned, held
    at ``now``, or its row is locked by a hold being taken.

    ``expires_at``: per job, when its ledger tier ends (``finished_at + ledger_days``). A
    backend that partitions the ledger tier by day (PostgreSQL) moves such a job's kept
    events into the partition of that day, which gc later drops whole (``LedgerDrop``); a
    job not named there (its ledger is kept forever) is trimmed in place. Returns the
    events removed."""

    job_ids: Sequence[int]
    keep: Callable[[list[TraceEvent]], list[TraceEvent]]
    now: float
    expires_at: Mapping[int, float] = field(default_factory=dict)


class JobPurge(Struct, frozen=True):
    """Count these jobs into their hours (``JobHours``), then delete them: their rows, their
    full-tier trace packs and index entries, their steps (ledger-tier packs in a day
    partition go with the partition: ``LedgerDrop``); a job is skipped as ``TraceTrim``
    skips it. Returns the jobs deleted."""

    job_ids: Sequence[int]
    now: float


class IdemPurge(Struct, frozen=True):
    """Forget these jobs' settled idempotency records (an in-flight claim stays)."""

    job_ids: Sequence[int]


class MessageIdForget(Struct, frozen=True):
    """Forget these finished jobs' message ids: the same message id makes a new job again."""

    job_ids: Sequence[int]


class LedgerPartitions(Struct, frozen=True):
    """Make sure a ledger partition exists for the day of each of these expiry times (its
    own short transaction: creating a partition locks the partitioned table). Returns the
    partitions made (0 on a backend without them)."""

    expires_at: Sequence[float]


class LedgerDrop(Struct, frozen=True):
    """Drop each ledger partition whose day ended before ``now`` and whose jobs are all
    deleted (a pinned job's packs were moved out by ``KeepPin``; a held job is not deleted).
    ``gc_apply`` answers ``LedgerDropped``: for the partitions after ``after`` (by name),
    a bounded number of them; its ``last`` is where the next call goes on."""

    now: float
    after: str = ""


class LedgerDropped(Struct, frozen=True):
    """What ``gc_apply(LedgerDrop)`` did: the days it dropped, and each day it had to keep because
    objects of the database's owner depend on its partition (a view over it, say): its
    partition's name and the server's account of what depends on it. gc never drops the
    owner's objects (no ``CASCADE``)."""

    dropped: int = 0
    kept: list[str] = []
    # The last partition looked at when the call stopped at its bound (call again with
    # ``after=last``); ``None``: every partition was looked at.
    last: str | None = None


class DerivedPurge(Struct, frozen=True):
    """Delete a derived trace: its packs and their index entries, its branch's state
    versions, the branch and the lineage row; nothing if its source job is held at ``now``."""

    trace_id: str
    now: float


class BlobPurge(Struct, frozen=True):
    """Delete these blobs (their hashes in hex), each only if nobody stored it since
    ``before``."""

    hashes: Sequence[str]
    before: float


class GcCursorPut(Struct, frozen=True):
    name: str
    cursor: int
    now: float


class GcVacuum(Struct, frozen=True):
    """Give freed pages back (SQLite incremental vacuum; nothing on PostgreSQL)."""


GcCount = (
    TraceTrim
    | JobPurge
    | IdemPurge
    | MessageIdForget
    | LedgerPartitions
    | DerivedPurge
    | BlobPurge
    | GcCursorPut
    | GcVacuum
)
"""The changes whose ``gc_apply`` answer is how many events, jobs or rows they removed."""

GcChange = GcCount | LedgerDrop
"""Every change gc makes (``gc_apply``): a count, or ``LedgerDropped`` for ``LedgerDrop``."""
