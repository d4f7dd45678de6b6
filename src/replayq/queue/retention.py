"""Retention in tiers and the gc pass that applies it (``replayq gc``).

A finished job moves through tiers as it ages (``Retention``):

* **full**: every event of its trace, for ``full_days`` after it finished;
* **ledger**: its lifecycle (``job.*``, ``step.*``, retries, lease ends), its effects
  ledger (``effect.*``, ``rq_idempotency`` untouched) and its state writes
  (``state.write``, ``rq_entity_versions`` untouched) — enough for ``trace show``,
  ``trace resource``, ``state history`` and ``effects list`` to answer "did it
  happen, how often, who wrote what" — until ``ledger_days``;
* **nothing**: the job row, its trace and its steps are deleted (``ledger_days``
  None: kept in the ledger tier forever).

Never collected: a job not finished, a job pinned with ``replayq keep``, a job a
replay, fork or rerun was derived from less than ``full_days`` ago. A pass walks
finished jobs by id in bounded batches (one transaction each), records the last id
it finished in ``rq_gc`` so a killed pass resumes there, and sleeps ``pause``
seconds between batches (the throttle).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from replayq.clock import Clock
from replayq.model import TraceEvent
from replayq.storage.protocol import GcScan, Storage, TraceQuery

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
DROPPED_LIFECYCLE = frozenset({"lease.extended"})


@dataclass(frozen=True)
class Retention:
    """How long a finished job's trace is kept in each tier, in days (None: forever)."""

    full_days: float | None = None
    ledger_days: float | None = None
    # The job's settled idempotency records (its effects' dedup keys): forgotten this
    # many days after the job finished (None: kept forever, whatever becomes of the job).
    idempotency_days: float | None = None

    def __post_init__(self) -> None:
        if (
            self.full_days is not None
            and self.ledger_days is not None
            and self.ledger_days < self.full_days
        ):
            raise ValueError("ledger_days must be at least full_days")


@dataclass(frozen=True)
class RetentionPolicy:
    """The app's default retention and its overrides per job type."""

    default: Retention = field(default_factory=Retention)
    by_type: Mapping[str, Retention] = field(default_factory=dict)

    def of(self, job_type: str) -> Retention:
        return self.by_type.get(job_type, self.default)

    def shortest_full_days(self) -> float | None:
        days = [r.full_days for r in (self.default, *self.by_type.values())]
        known = [d for d in days if d is not None]
        return min(known) if known else None


def in_ledger(event: TraceEvent) -> bool:
    """Whether the ledger tier keeps ``event``."""
    if event.name.startswith(LEDGER_PREFIXES):
        return True
    return event.kind == "lifecycle" and event.name not in DROPPED_LIFECYCLE


@dataclass
class GcReport:
    """What a gc pass did (or, dry, would do)."""

    dry_run: bool
    scanned: int = 0
    trimmed_jobs: int = 0
    events_removed: int = 0
    purged_jobs: int = 0
    idempotency_jobs: int = 0
    batches: int = 0
    resumed_from: int = 0
    seconds: float = 0.0
    complete: bool = True


CURSOR = "trace"
# The job type of the built-in periodic gc (``App.gc_periodic``).
GC_JOB = "replayq.gc"


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
    """One gc pass over the finished jobs past their full tier (see the module's text).

    ``progress(done, cursor)`` is called after each batch. ``max_batches`` stops the
    pass early (the cursor keeps where it got to; the next pass resumes there).
    """
    started = time.monotonic()
    now = clock.now()
    shortest = policy.shortest_full_days()
    with storage.transaction() as tx:
        after = tx.gc_cursor(CURSOR)
    report = GcReport(dry_run=dry_run, resumed_from=after)
    if shortest is None:
        report.seconds = time.monotonic() - started
        return report
    cutoff = now - shortest * DAY
    while max_batches is None or report.batches < max_batches:
        with storage.transaction() as tx:
            found = tx.gc_candidates(GcScan(after=after, cutoff=cutoff, limit=batch))
            for candidate in found:
                rule = policy.of(candidate.job_type)
                age = now - candidate.finished_at
                if rule.full_days is None or age < rule.full_days * DAY:
                    continue
                if rule.idempotency_days is not None and age >= rule.idempotency_days * DAY:
                    report.idempotency_jobs += 1
                    if not dry_run:
                        tx.idem_purge(candidate.job_id)
                if rule.ledger_days is not None and age >= rule.ledger_days * DAY:
                    report.purged_jobs += 1
                    if not dry_run:
                        tx.job_purge(candidate.job_id)
                    continue
                removed = (
                    _count_removed(tx.trace_query, candidate.job_id)
                    if dry_run
                    else tx.trace_trim(candidate.job_id, in_ledger)
                )
                if removed:
                    report.trimmed_jobs += 1
                    report.events_removed += removed
            report.scanned += len(found)
            if found:
                after = found[-1].job_id
            if not dry_run:
                # The end reached: the next pass starts over (jobs age into their tier).
                tx.gc_cursor_put(CURSOR, after if len(found) == batch else 0, now)
        report.batches += 1
        if not dry_run and found:
            with storage.transaction() as tx:
                tx.gc_vacuum()
        if progress is not None:
            progress(report.scanned, after)
        if len(found) < batch:
            break
        if pause:
            time.sleep(pause)
    else:
        report.complete = False
    report.seconds = time.monotonic() - started
    return report


def _count_removed(query: Callable[..., list[TraceEvent]], job_id: int) -> int:
    return sum(1 for event in query(TraceQuery(job_id=job_id)) if not in_ledger(event))
