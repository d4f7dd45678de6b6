"""Retention in tiers and the gc pass that applies it (``replayq gc``).

A finished job moves through tiers as it ages (``Retention``):

* **full**: every event of its trace, for ``full_days`` after it finished;
* **ledger**: its lifecycle (``job.*``, ``step.*``, retries, lease ends), its effects
  ledger (``effect.*``, ``rq_idempotency`` untouched) and its state writes
  (``state.write``, ``rq_entity_versions`` untouched) — enough for ``trace show``,
  ``trace resource``, ``state history`` and ``effects list`` to answer "did it
  happen, how often, who wrote what" — and each attempt's heartbeats as one lease
  interval (``to_ledger``), until ``ledger_days``;
* **nothing**: the job row, its trace and its steps are deleted (``ledger_days``
  None: kept in the ledger tier forever).

Retention is set on the app (a default and per type) and in a job's contract
(``@app.job(retention=...)``), whose fields override the app's (``RetentionPolicy``).

Never collected: a job not finished, a job pinned with ``replayq keep``, a job a
replay, fork or rerun was derived from less than ``full_days`` ago, a job a live fork
or rerun holds (``replay/hold.py``). A pass walks finished jobs by id in bounded
batches (each read, then changed in one transaction of a few set-based statements),
records the last id it finished in ``rq_gc`` so a killed pass resumes there, and sleeps
``pause`` seconds between batches (the throttle). On PostgreSQL a job with a finite
``ledger_days`` moves into the ledger partition of the day its ledger ends, and once
the pass reaches the end it drops the partitions of the days that ended with none of
their jobs left (``LedgerDrop``); a day whose partition an object of the database's
owner depends on (a view over it) is kept, named in ``GcReport.partitions_kept`` and
logged, never dropped with the owner's object. Then it deletes the derived traces past
their type's ``derived_days`` and the blobs nothing references any more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from replayq.clock import Clock
from replayq.errors import ConfigurationError
from replayq.model import TraceEvent
from replayq.storage.params import TraceQuery
from replayq.storage.protocol import Storage
from replayq.storage.retention_params import (
    BlobPurge,
    BlobScan,
    DerivedPurge,
    DerivedScan,
    GcCursor,
    GcCursorPut,
    GcHighestId,
    GcScan,
    GcVacuum,
    IdemPurge,
    JobPurge,
    LedgerDrop,
    LedgerPartitions,
    MessageIdForget,
    TraceTrim,
)

log = logging.getLogger("replayq.retention")

DAY = 86_400.0

# The ledger tier keeps these events (by name prefix) and every lifecycle event but
# the heartbeat's lease extensions.
LEDGER_PREFIXES = (
    "job.",
    "step.",
    "effect.",
    "state.write",
    "state.conflict",
    "retry.",
    "child.",
    "outbox.",
    "write.fenced",
)
LEASE_EXTENDED = "lease.extended"
DROPPED_LIFECYCLE = frozenset({LEASE_EXTENDED})


# The fields a job contract may set (``App.job(retention=...)``), overriding the app's.
RETENTION_FIELDS = (
    "full_days",
    "ledger_days",
    "idempotency_days",
    "message_id_days",
    "derived_days",
)


@dataclass(frozen=True)
class Retention:
    """How long a finished job's trace is kept in each tier, in days (None: forever)."""

    full_days: float | None = None
    ledger_days: float | None = None
    # The job's settled idempotency records (its effects' dedup keys): forgotten this
    # many days after the job finished (None: kept forever, whatever becomes of the job).
    idempotency_days: float | None = None
    # The job's message id: forgotten (the same message makes a new job again) this many
    # days after the job finished (None: as long as the job row is kept).
    message_id_days: float | None = None
    # The derived traces (dry-runs, forks, verifications) of the job's recordings: deleted
    # this many days after they were made (None: kept forever).
    derived_days: float | None = None

    def __post_init__(self) -> None:
        for name in RETENTION_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"Retention.{name} must not be negative, got {value!r}")
        if (
            self.full_days is not None
            and self.ledger_days is not None
            and self.ledger_days < self.full_days
        ):
            raise ValueError("ledger_days must be at least full_days")

    def fields(self) -> dict[str, float | None]:
        """Every field, as a contract stores it (None: forever)."""
        return {name: getattr(self, name) for name in RETENTION_FIELDS}


# A job contract's retention: the fields it sets (a field it leaves out: the app's).
ContractRetention = Mapping[str, "float | None"]


def check_contract_retention(
    job_type: str, given: Retention | ContractRetention
) -> dict[str, float | None]:
    """The fields a contract's ``retention=`` sets, checked (``ValueError`` says what is wrong)."""
    fields = given.fields() if isinstance(given, Retention) else dict(given)
    unknown = sorted(set(fields) - set(RETENTION_FIELDS))
    if unknown:
        raise ValueError(
            f"{job_type}: unknown retention field(s) {', '.join(unknown)}; "
            f"known: {', '.join(RETENTION_FIELDS)}"
        )
    Retention(**fields)  # the same checks as the app's
    return {name: fields[name] for name in RETENTION_FIELDS if name in fields}


class RetentionPolicy(msgspec.Struct, frozen=True):
    """The app's default retention, its overrides per job type, and the job contracts'.

    ``contracts``: the retention fields each declared contract sets (an empty mapping:
    none), by ``(type, version)``; the key ``(type, None)`` is the type's active version,
    for a job whose version is not declared. A contract's field overrides the app's
    (``by_type``, else ``default``).
    """

    default: Retention = msgspec.field(default_factory=Retention)
    by_type: Mapping[str, Retention] = msgspec.field(default_factory=dict)
    contracts: Mapping[tuple[str, str | None], ContractRetention] = msgspec.field(
        default_factory=dict
    )

    def of(self, job_type: str, version: str | None = None) -> Retention:
        base = self.by_type.get(job_type, self.default)
        fields = self.contracts.get((job_type, version))
        if fields is None:
            fields = self.contracts.get((job_type, None))
        if not fields:
            return base
        try:
            return replace(base, **fields)
        except ValueError as exc:
            raise ConfigurationError(
                f"{job_type} {version or ''}: the contract's retention {dict(fields)} with the "
                f"app's {base}: {exc}"
            ) from None

    def _all(self) -> list[Retention]:
        found = [self.default, *self.by_type.values()]
        found.extend(self.of(job_type, version) for job_type, version in self.contracts if version)
        return found

    def shortest(self, name: str) -> float | None:
        """The shortest ``name`` (a ``Retention`` field) of any type, app or contract."""
        known = [d for d in (getattr(r, name) for r in self._all()) if d is not None]
        return min(known) if known else None

    def shortest_full_days(self) -> float | None:
        return self.shortest("full_days")

    def configured(self) -> bool:
        """Whether gc has anything to do by age (a full tier, or derived traces' days)."""
        return self.shortest("full_days") is not None or self.shortest("derived_days") is not None


def in_ledger(event: TraceEvent) -> bool:
    """Whether the ledger tier keeps ``event`` as it is."""
    if event.name.startswith(LEDGER_PREFIXES):
        return True
    return event.kind == "lifecycle" and event.name not in DROPPED_LIFECYCLE


def to_ledger(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """What the ledger tier keeps of a job's trace: the events ``in_ledger`` accepts, and
    each attempt's heartbeats as one lease interval: its last ``lease.extended`` event
    (the lease's last deadline) with ``beats`` (how many) and ``extended_from`` (the time
    of the first)."""
    kept: list[TraceEvent] = []
    beats: dict[int | None, list[TraceEvent]] = {}
    for event in events:
        if in_ledger(event):
            kept.append(event)
        elif event.name == LEASE_EXTENDED:
            beats.setdefault(event.attempt, []).append(event)
    for run in beats.values():
        last = run[-1]
        # An interval kept by an earlier pass counts as the beats it stands for.
        count = sum(int(e.data.get("beats", 1)) for e in run)
        interval = {
            **last.data,
            "beats": count,
            "extended_from": run[0].data.get("extended_from", run[0].ts),
        }
        kept.append(replace(last, data=interval))
    kept.sort(key=lambda e: (e.hlc, e.id or 0))
    return kept


@dataclass
class GcReport:
    """What a gc pass did (or, dry, would do)."""

    dry_run: bool
    scanned: int = 0
    trimmed_jobs: int = 0
    events_removed: int = 0
    purged_jobs: int = 0
    idempotency_jobs: int = 0
    message_id_jobs: int = 0
    derived_traces: int = 0
    partitions_dropped: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    batches: int = 0
    resumed_from: int = 0
    seconds: float = 0.0
    complete: bool = True
    # Expired ledger days kept because the owner's objects depend on their partition:
    # "partition: what depends on it" each (the server's words). ``replayq gc`` exits 1.
    partitions_kept: list[str] = field(default_factory=list)


CURSOR = "trace"
# A batch's scan reads at most ``batch * WINDOW`` ids past the cursor.
WINDOW = 8
# The job type of the built-in periodic gc (``App.gc_periodic``).
GC_JOB = "replayq.gc"
# A blob stored (or stored again) this recently is never collected: a commit in flight may
# be about to reference it (``blob_put`` touches an existing blob's ``used_at``).
BLOB_GRACE = 3600.0


def run_gc(
    storage: Storage,
    clock: Clock,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    batch: int = 500,
    pause: float = 0.0,
    max_batches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GcReport:
    """One gc pass (see the module's text): the finished jobs past their full tier, then
    the derived traces past their days, then the blobs nothing references any more.

    ``progress(done, cursor)`` is called after each batch of jobs. ``max_batches`` stops
    the pass early (the cursor keeps where it got to; the next pass resumes there, and
    collects derived traces and blobs once it reaches the end).
    """
    started = time.monotonic()
    now = clock.now()
    with storage.transaction() as tx:
        after = tx.gc_scan(GcCursor(CURSOR))
    report = GcReport(dry_run=dry_run, resumed_from=after)
    if policy.shortest_full_days() is not None:
        _jobs(storage, now, policy, report, after, batch, pause, max_batches, progress)
    if report.complete and policy.configured():
        _derived(storage, now, policy, report, batch, pause)
        _blobs(storage, now, report, batch)
    report.seconds = time.monotonic() - started
    return report


def _jobs(
    storage: Storage,
    now: float,
    policy: RetentionPolicy,
    report: GcReport,
    after: int,
    batch: int,
    pause: float,
    max_batches: int | None,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Trim, forget and delete finished jobs by id, ``batch`` per transaction: each change
    is one set-based call for the whole batch (a handful of statements, not a few a job)."""
    dry_run = report.dry_run
    shortest = policy.shortest_full_days()
    assert shortest is not None
    cutoff = now - shortest * DAY
    prepared: set[int] = set()  # the ledger days whose partition this pass made sure of

    def keep(events: list[TraceEvent]) -> list[TraceEvent]:
        kept = to_ledger(events)
        if len(kept) < len(events):
            report.trimmed_jobs += 1
        return kept

    with storage.transaction(readonly=True) as tx:
        highest = tx.gc_scan(GcHighestId())
    while max_batches is None or report.batches < max_batches:
        # A window of ids at a time (the primary key's range: a plan that holds without
        # statistics); a window with fewer than ``batch`` candidates is walked past.
        until = min(after + batch * WINDOW, highest)
        with storage.transaction(readonly=True) as tx:
            found = tx.gc_scan(
                GcScan(after=after, until=until, cutoff=cutoff, limit=batch, now=now)
            )
        forget_idem: list[int] = []
        forget_message: list[int] = []
        purge: list[int] = []
        trim: list[int] = []
        expires_at: dict[int, float] = {}
        for candidate in found:
            rule = policy.of(candidate.job_type, candidate.version)
            age = now - candidate.finished_at
            if rule.full_days is None or age < rule.full_days * DAY:
                continue
            if _past(rule.idempotency_days, age):
                forget_idem.append(candidate.job_id)
            if _past(rule.message_id_days, age):
                forget_message.append(candidate.job_id)
            if _past(rule.ledger_days, age):
                purge.append(candidate.job_id)
                continue
            trim.append(candidate.job_id)
            if rule.ledger_days is not None:
                expires_at[candidate.job_id] = candidate.finished_at + rule.ledger_days * DAY
        report.idempotency_jobs += len(forget_idem)
        report.message_id_jobs += len(forget_message)
        full = len(found) == batch
        after = found[-1].job_id if full else until
        ended = not full and after >= highest
        if dry_run:
            report.purged_jobs += len(purge)
            with storage.transaction(readonly=True) as tx:
                for job_id in trim:
                    removed = _count_removed(tx.trace_query, job_id)
                    if removed:
                        report.trimmed_jobs += 1
                        report.events_removed += removed
        else:
            days = {int(at // DAY) for at in expires_at.values()} - prepared
            if days:
                with storage.transaction() as tx:
                    tx.gc_apply(LedgerPartitions([day * DAY for day in sorted(days)]))
                prepared |= days
            with storage.transaction() as tx:
                if forget_idem:
                    tx.gc_apply(IdemPurge(forget_idem))
                if forget_message:
                    tx.gc_apply(MessageIdForget(forget_message))
                if purge:
                    report.purged_jobs += tx.gc_apply(JobPurge(purge, now))
                if trim:
                    report.events_removed += tx.gc_apply(TraceTrim(trim, keep, now, expires_at))
                # The end reached: the next pass starts over (jobs age into their tier).
                tx.gc_apply(GcCursorPut(CURSOR, 0 if ended else after, now))
        report.scanned += len(found)
        report.batches += 1
        if not dry_run and found:
            with storage.transaction() as tx:
                tx.gc_apply(GcVacuum())
        if progress is not None:
            progress(report.scanned, after)
        if ended:
            if not dry_run:
                _drop_days(storage, now, report)
            return
        if pause and found:
            time.sleep(pause)
    report.complete = False


def _drop_days(storage: Storage, now: float, report: GcReport) -> None:
    """Drop the expired ledger days, a bounded number per transaction (each day is a
    subtransaction on PostgreSQL); a day kept because the owner's objects depend on its
    partition is named in the report and logged."""
    after = ""
    while True:
        with storage.transaction() as tx:
            dropped = tx.gc_apply(LedgerDrop(now, after))
        report.partitions_dropped += dropped.dropped
        report.partitions_kept += dropped.kept
        for kept in dropped.kept:
            log.warning(
                "gc kept an expired ledger day: objects of the database's owner depend on "
                "its partition (drop or move them): %s",
                kept,
            )
        if dropped.last is None:
            return
        after = dropped.last


def _derived(
    storage: Storage,
    now: float,
    policy: RetentionPolicy,
    report: GcReport,
    batch: int,
    pause: float,
) -> None:
    """Delete the derived traces past their type's ``derived_days`` (oldest first)."""
    shortest = policy.shortest("derived_days")
    if shortest is None:
        return
    cutoff = now - shortest * DAY
    cursor: tuple[float, str] = (-1.0, "")
    while True:
        with storage.transaction() as tx:
            found = tx.gc_scan(DerivedScan(after=cursor, cutoff=cutoff, limit=batch, now=now))
            for derived in found:
                rule = (
                    policy.of(derived.job_type, derived.version)
                    if derived.job_type is not None
                    else policy.default
                )
                if not _past(rule.derived_days, now - derived.created_at):
                    continue
                if report.dry_run:
                    report.derived_traces += 1
                else:
                    report.derived_traces += tx.gc_apply(DerivedPurge(derived.trace_id, now))
        if found:
            cursor = (found[-1].created_at, found[-1].trace_id)
        if len(found) < batch:
            return
        if pause:
            time.sleep(pause)


def _blobs(storage: Storage, now: float, report: GcReport, batch: int) -> None:
    """Delete the blobs nothing references any more (nobody stored within ``BLOB_GRACE``)."""
    before = now - BLOB_GRACE
    after = ""
    while True:
        with storage.transaction() as tx:
            found = tx.gc_scan(BlobScan(after=after, before=before, limit=batch))
            if found and not report.dry_run:
                removed = tx.gc_apply(BlobPurge([b.hash for b in found], before))
            else:
                removed = len(found)
            report.blobs += removed
            if removed == len(found):
                report.blob_bytes += sum(b.stored_size for b in found)
        if found:
            after = found[-1].hash
        if len(found) < batch:
            return


def _past(days: float | None, age: float) -> bool:
    return days is not None and age >= days * DAY


def _count_removed(query: Callable[..., list[TraceEvent]], job_id: int) -> int:
    events = query(TraceQuery(job_id=job_id))
    return len(events) - len(to_ledger(events))
