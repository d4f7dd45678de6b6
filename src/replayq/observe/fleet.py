"""Fleet gauges read from the database at scrape time (``replayq metrics serve``).

A worker's counters say what that process did; these gauges say what the
queue looks like now, whichever worker (or none) is running: backlog, age of
the oldest ready job, jobs in flight, dead jobs, jobs out of order against their
ordering key, outbox lag, locks held and expired, effects in doubt. One scrape is
a handful of aggregate queries in one read transaction; scrape no more often than
every few seconds on a big table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from replayq.observe.replays import LABELS, DerivedRuns
from replayq.runtime import RuntimeSource
from replayq.storage.context_params import LockFilter
from replayq.storage.protocol import IdemFilter
from replayq.storage.reports import JobGauges, OutboxPending, OutOfOrder

STATES = ("queued", "running", "dead")  # the open states ``replayq_jobs`` reports


class FleetCollector:
    """A ``prometheus_client`` custom collector over one database."""

    def __init__(self, source: RuntimeSource) -> None:
        self.runtime = source.runtime
        self.derived = DerivedRuns(source)
        # Every (queue, job_type, version) reported so far: when its jobs drain, its states
        # read 0 instead of vanishing (an absent series is "no data", and an alert on
        # ``replayq_jobs{state="dead"} > 0`` or a backlog graph cannot tell it from a
        # failed scrape). Bounded by the queues, types and versions there are.
        self._groups: set[tuple[str, str, str]] = set()

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only; no read at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = self.runtime.clock.now()
        with self.runtime.storage.transaction(readonly=True) as tx:
            gauges = tx.report(JobGauges(now))
            out_of_order = tx.report(OutOfOrder())
            outbox = tx.report(OutboxPending())
            locks = tx.lock_list(LockFilter())
            in_doubt = tx.idem_list(IdemFilter(in_doubt=True, limit=100_000))
        labels = ["queue", "job_type", "version"]
        jobs = GaugeMetricFamily(
            "replayq_jobs",
            "Open jobs by state (queued: backlog; running: in flight; dead: DLQ).",
            labels=[*labels, "state"],
        )
        oldest = GaugeMetricFamily(
            "replayq_oldest_ready_age_seconds",
            "Age of the oldest job due to run and not yet leased (starvation).",
            labels=labels,
        )
        longest = GaugeMetricFamily(
            "replayq_oldest_running_seconds",
            "How long the longest-running leased job has held its lease.",
            labels=labels,
        )
        counts = {(group, state): 0.0 for group in self._groups for state in STATES}
        for row in gauges:
            group = (row.queue, row.job_type, row.version or "none")
            key = list(group)
            self._groups.add(group)
            counts[(group, row.state)] = float(row.count)
            if row.oldest_ready is not None:
                oldest.add_metric(key, max(0.0, now - float(row.oldest_ready)))
            if row.oldest_leased is not None:
                longest.add_metric(key, max(0.0, now - float(row.oldest_leased)))
        for (group, state), count in sorted(counts.items()):
            jobs.add_metric([*group, state], count)
        yield jobs
        yield oldest
        yield longest
        broken = GaugeMetricFamily(
            "replayq_jobs_out_of_order",
            "Jobs run (or waiting) after an earlier job of their ordering key died or was "
            "cancelled: per-key order broken (e.g. a cancel handled without its create).",
            labels=labels,
        )
        for order_break in out_of_order:
            key = [order_break.queue, order_break.job_type, order_break.version or "none"]
            broken.add_metric(key, float(order_break.count))
        yield broken
        yield GaugeMetricFamily(
            "replayq_outbox_pending",
            "Outbox rows written but not yet published.",
            value=float(outbox.pending),
        )
        lag = now - float(outbox.oldest) if outbox.oldest is not None else 0.0
        yield GaugeMetricFamily(
            "replayq_outbox_lag_seconds", "Age of the oldest unpublished outbox row.", value=lag
        )
        held = [lock for lock in locks if (lock.expires_at or 0) > now]
        yield GaugeMetricFamily(
            "replayq_locks_held", "Locks held with a live lease.", value=len(held)
        )
        yield GaugeMetricFamily(
            "replayq_locks_orphaned",
            "Locks whose lease ran out without a release (left by a crashed or stalled holder).",
            value=len(locks) - len(held),
        )
        yield GaugeMetricFamily(
            "replayq_effects_in_doubt",
            "Effects in doubt, waiting to be resolved.",
            value=len(in_doubt),
        )
        self.derived.refresh()
        replays = CounterMetricFamily(
            "replayq_replays",
            "Finished dry-runs (mode=replay), forks and reruns, by how they ended and whether "
            "their diff against the original attempt is not empty (diverged).",
            labels=list(LABELS),
        )
        for labelled, count in sorted(self.derived.counts.items()):
            replays.add_metric(list(labelled), float(count))
        yield replays


def fleet_registry(source: RuntimeSource) -> Any:
    """A registry holding only the fleet collector over ``source``'s database."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(FleetCollector(source))
    return registry
