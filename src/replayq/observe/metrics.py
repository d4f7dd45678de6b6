"""Prometheus metrics of one worker process, counted from committed trace events.

Every metric is labelled by ``job_type``, ``version`` (handler version) and
``queue``; failures also by ``error_class`` (the five failure classes plus
``in_doubt``), dead jobs by ``reason`` (``DeadReason``), effects by ``kind``
(declared in the contract) and cache reads by ``result``. Label values are
bounded sets: never a job id, a key or a message. The table with the seed line
each metric answers is ``docs/reference/metrics.md``.

A metric counts an event only once its transaction committed (the tap), so a
fenced step that rolled back counts as ``replayq_fenced_writes_total`` and not
as the state write it attempted.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from replayq.model import Job, TraceEvent
from replayq.observe.hooks import Observer, ReleaseReason

BASE_LABELS = ("job_type", "version", "queue")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTL_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 15, 25)
_REMEMBERED_JOBS = 10_000


@dataclass(frozen=True)
class Counted:
    """An event counted by a counter: the metric, its help, extra label names, how to read them."""

    metric: str
    help: str
    extra: tuple[str, ...] = ()
    read: Callable[[TraceEvent], tuple[str, ...]] = lambda event: ()


def _error_class(event: TraceEvent) -> tuple[str, ...]:
    return (str(event.data.get("error_class") or event.data.get("reason") or "unknown"),)


def _namespace(event: TraceEvent) -> tuple[str, ...]:
    """The cache namespace of a read's key (``profile`` of ``profile:7:v3``): a name in code,
    where a key's schema version lives (a new value format gets a new namespace)."""
    return (str(event.data.get("key") or "unknown").split(":", 1)[0],)


def _kind(event: TraceEvent) -> tuple[str, ...]:
    return (str(event.data.get("kind") or "unknown"),)


# The one table: which committed event moves which counter. Policy as data.
COUNTERS: dict[str, Counted] = {
    "job.leased": Counted("replayq_jobs_leased_total", "Jobs leased (deliveries)."),
    "job.succeeded": Counted("replayq_jobs_succeeded_total", "Attempts acked as succeeded."),
    "job.failed": Counted(
        "replayq_jobs_failed_total",
        "Attempts that raised, by class.",
        ("error_class",),
        _error_class,
    ),
    "retry.scheduled": Counted(
        "replayq_retries_total",
        "Retries scheduled, by the failure's class.",
        ("error_class",),
        _error_class,
    ),
    "job.dead": Counted(
        "replayq_jobs_dead_total",
        "Jobs moved to the investigation queue (DLQ inflow).",
        ("error_class", "reason"),
        lambda e: (
            str(e.data.get("error_class") or "none"),
            str(e.data.get("reason") or "unknown"),
        ),
    ),
    "lease.expired": Counted(
        "replayq_lease_expiries_total", "Leases that ran out before the job settled (timeouts)."
    ),
    "job.redelivered": Counted(
        "replayq_redeliveries_total", "Jobs re-delivered after their lease expired."
    ),
    "lease.lost": Counted(
        "replayq_leases_lost_total", "Heartbeats that found the job's lease taken."
    ),
    "job.write_rejected": Counted(
        "replayq_settles_rejected_total", "Settles refused: the worker no longer held the lease."
    ),
    "job.deduplicated": Counted(
        "replayq_enqueues_deduplicated_total", "Enqueues answered with an existing job."
    ),
    "lock.acquired": Counted("replayq_locks_acquired_total", "Locks acquired."),
    "lock.timeout": Counted("replayq_lock_timeouts_total", "Lock acquisitions that gave up."),
    "lock.expired": Counted(
        "replayq_locks_expired_total", "Locks lost before the holder released them."
    ),
    "lock.broken": Counted("replayq_locks_broken_total", "Orphaned locks broken by an operator."),
    "cache.read": Counted(
        "replayq_cache_reads_total",
        "Cache reads, hit or miss, per cache namespace (the key's schema version).",
        ("namespace", "result"),
        lambda e: (*_namespace(e), "hit" if e.data.get("hit") else "miss"),
    ),
    "cache.decode_error": Counted(
        "replayq_cache_codec_errors_total",
        "Cache entries that could not be decoded (read as a miss) or values not encodable.",
        ("namespace", "direction"),
        lambda e: (*_namespace(e), "decode"),
    ),
    "cache.encode_error": Counted(
        "replayq_cache_codec_errors_total",
        "Cache entries that could not be decoded (read as a miss) or values not encodable.",
        ("namespace", "direction"),
        lambda e: (*_namespace(e), "encode"),
    ),
    "cache.stale_read": Counted(
        "replayq_cache_stale_reads_total", "Cache reads older than the source entity."
    ),
    "effect.succeeded": Counted("replayq_effects_total", "Effects performed.", ("kind",), _kind),
    "effect.failed": Counted(
        "replayq_effects_failed_total", "Effects that raised.", ("kind",), _kind
    ),
    "effect.deduplicated": Counted(
        "replayq_effects_deduplicated_total",
        "Effects not repeated: the idempotency key had succeeded (work that would run twice).",
        ("kind",),
        _kind,
    ),
    "effect.in_doubt": Counted(
        "replayq_effects_in_doubt_total", "Effects found in doubt (a crashed attempt's claim)."
    ),
    "state.conflict": Counted(
        "replayq_version_conflicts_total", "State writes rejected by the optimistic version check."
    ),
    "state.write_rejected": Counted(
        "replayq_fenced_writes_total",
        "Writes refused for a stale token (where: lock or lease).",
        ("where",),
        lambda e: ("lock",),
    ),
    "write.fenced": Counted(
        "replayq_fenced_writes_total",
        "Writes refused for a stale token (where: lock or lease).",
        ("where",),
        lambda e: ("lease",),
    ),
    "outbox.written": Counted(
        "replayq_outbox_written_total",
        "Outbox rows written (deduplicated: an earlier attempt wrote the same id).",
        ("deduplicated",),
        lambda e: ("true" if e.data.get("deduplicated") else "false",),
    ),
}


# Events that feed a histogram but move no counter.
_OBSERVED = frozenset({"cache.write"})


def _labels(job: Job) -> tuple[str, str, str]:
    return (job.job_type, job.handler_version or "none", job.queue)


class WorkerMetrics(Observer):
    """Counters and histograms of this process, in their own registry.

    ``lookup(job_id)`` finds a job the worker did not lease (an enqueue in the
    same process, a lock broken by hand) to label its events; without it they
    are labelled ``unknown``.
    """

    def __init__(
        self,
        lookup: Callable[[int], Job | None] | None = None,
        *,
        connections: Callable[[], int] | None = None,
    ) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            ProcessCollector,
        )

        self.registry = CollectorRegistry()
        # Resource usage: process_cpu_seconds_total, process_resident_memory_bytes,
        # process_open_fds (Linux /proc), beside the database connections held.
        ProcessCollector(registry=self.registry)
        self.connections = Gauge(
            "replayq_db_connections",
            "Database connections this worker process holds open.",
            registry=self.registry,
        )
        if connections is not None:
            self.connections.set_function(connections)
        self._lookup = lookup
        self._jobs: OrderedDict[int, tuple[str, str, str]] = OrderedDict()
        self._jobs_lock = threading.Lock()
        self.counters: dict[str, Any] = {}
        for counted in COUNTERS.values():
            if counted.metric not in self.counters:
                name = counted.metric.removesuffix("_total")
                self.counters[counted.metric] = Counter(
                    name, counted.help, (*BASE_LABELS, *counted.extra), registry=self.registry
                )
        self.duration = Histogram(
            "replayq_job_duration_seconds",
            "Attempt duration (handler run to settle), by outcome; compare with the lease.",
            (*BASE_LABELS, "outcome"),
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "replayq_ack_latency_seconds",
            "Enqueue to ack of succeeded jobs (queueing, retries and run).",
            BASE_LABELS,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.attempts = Histogram(
            "replayq_attempts_per_job",
            "The attempt a job succeeded or died on (1: first try).",
            (*BASE_LABELS, "outcome"),
            buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )
        self.lock_wait = Histogram(
            "replayq_lock_wait_seconds",
            "Time waited to acquire a lock (acquired or timed out).",
            BASE_LABELS,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.lease = Gauge(
            "replayq_lease_seconds",
            "The lease of the job type's version as last leased (the duration tail's limit).",
            BASE_LABELS,
            registry=self.registry,
        )
        self.cache_ttl = Histogram(
            "replayq_cache_ttl_seconds",
            "The TTL each cache write set, per namespace (+Inf: written without a TTL).",
            (*BASE_LABELS, "namespace"),
            buckets=TTL_BUCKETS,
            registry=self.registry,
        )
        self.cache_age = Histogram(
            "replayq_cache_hit_age_seconds",
            "Age of the entry a read hit, per namespace (beside the TTL: the expiry pattern).",
            (*BASE_LABELS, "namespace"),
            buckets=TTL_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "replayq_worker_in_flight", "Attempts running in this process.", registry=self.registry
        )
        self.released_jobs = Counter(
            "replayq_jobs_released",
            "Leased jobs this worker let go of without running them, by reason (stopped: "
            "given back at stop; lost: taken while they waited; not_renewed; error: their "
            "start raised).",
            (*BASE_LABELS, "reason"),
            registry=self.registry,
        )
        # The enqueue time of each attempt running here (ack latency), kept from ``attempt``
        # to ``settled`` only: a job leased or reaped but never run here leaves nothing.
        self._created: dict[int, float] = {}

    # -- Observer ---------------------------------------------------------------------------

    def job_seen(self, job: Job) -> None:
        self._remember(job)
        if job.lease_deadline is not None and job.leased_at is not None:
            self.lease.labels(*_labels(job)).set(job.lease_deadline - job.leased_at)

    @contextmanager
    def attempt(self, job: Job, worker_id: str) -> Iterator[None]:
        self.job_seen(job)
        self._created[job.id] = job.created_at
        self.in_flight.inc()
        yield

    def settled(self, job: Job) -> None:
        self.in_flight.dec()
        self._created.pop(job.id, None)

    def released(self, job: Job, reason: ReleaseReason) -> None:
        self.released_jobs.labels(*_labels(job), str(reason)).inc()

    def events(self, events: Sequence[TraceEvent]) -> None:
        for event in events:
            if event.job_id is None:
                continue  # derived traces (replay, fork) are not production telemetry
            counted = COUNTERS.get(event.name)
            if counted is None and event.name not in _OBSERVED:
                continue
            base = self._labels_of(event.job_id)
            if counted is not None:
                self.counters[counted.metric].labels(*base, *counted.read(event)).inc()
            self._observe(event, base)

    # -- internals --------------------------------------------------------------------------

    def _observe(self, event: TraceEvent, base: tuple[str, str, str]) -> None:
        data = event.data
        if event.name in ("job.succeeded", "job.failed") and data.get("duration") is not None:
            outcome = "succeeded" if event.name == "job.succeeded" else "failed"
            self.duration.labels(*base, outcome).observe(float(data["duration"]))
        if event.name == "job.succeeded":
            self.attempts.labels(*base, "succeeded").observe(event.attempt or 1)
            created = self._created.get(event.job_id or 0)
            if created is not None:
                self.latency.labels(*base).observe(max(0.0, event.ts - created))
        elif event.name == "job.dead":
            self.attempts.labels(*base, "dead").observe(event.attempt or 1)
        elif event.name in ("lock.acquired", "lock.timeout") and data.get("wait") is not None:
            self.lock_wait.labels(*base).observe(float(data["wait"]))
        elif event.name == "cache.write":
            ttl = data.get("ttl")
            self.cache_ttl.labels(*base, *_namespace(event)).observe(
                float(ttl) if ttl else math.inf
            )
        elif event.name == "cache.read" and data.get("age") is not None:
            self.cache_age.labels(*base, *_namespace(event)).observe(float(data["age"]))

    def _remember(self, job: Job) -> None:
        with self._jobs_lock:
            self._jobs[job.id] = _labels(job)
            self._jobs.move_to_end(job.id)
            while len(self._jobs) > _REMEMBERED_JOBS:
                self._jobs.popitem(last=False)

    def _labels_of(self, job_id: int) -> tuple[str, str, str]:
        with self._jobs_lock:
            known = self._jobs.get(job_id)
        if known is not None:
            return known
        job = self._lookup(job_id) if self._lookup is not None else None
        if job is None:
            return ("unknown", "none", "unknown")
        self._remember(job)
        return _labels(job)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` serves)."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


def serve(registry: Any, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``registry`` on ``http://host:port/metrics`` (a daemon thread); returns the server."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
