"""What every part of the worker shares: its options, the in-flight table, its stats.

``WorkerCore`` holds the state the dispatcher, the executors and the heartbeat
thread read and write (under ``_inflight_lock``); the modules beside this one add
each part's methods, and ``process.Worker`` puts them together.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from replayq.errors import UnknownJobTypeError
from replayq.model import Job
from replayq.observe.hooks import Observer, Observers
from replayq.observe.logs import redact_with as redact_logs_with
from replayq.queue.handlers import Handler
from replayq.queue.scheduler import Scheduler
from replayq.recording.context import Context
from replayq.recording.world import LostFlag
from replayq.rollout.router import REFRESH_SECONDS, Router
from replayq.runtime import RuntimeSource
from replayq.worker.event_loop import EventLoopThread

# Put on the work queue once per executor at shutdown: the executor ends.
STOP = object()

# Jobs leased ahead of the running ones (``Worker(prefetch=...)``); measured in
# ``benchmarks/worker_batch.py`` (docs/benchmarks.md, "Batched claims").
DEFAULT_PREFETCH = 1
# How long the first ack of a group may wait for others (seconds; the heartbeat thread
# looks every 50 ms). An executor that waits for its ack or has nothing else to run
# commits the group at once, so an idle or synchronous worker never waits this out.
DEFAULT_ACK_WINDOW = 0.005


@dataclass
class InFlight:
    """A job this worker holds a lease on."""

    job: Job
    lease_seconds: float
    heartbeat_seconds: float
    next_heartbeat: float
    started: float
    lost: LostFlag = field(default_factory=LostFlag)
    # Set by the heartbeat when the job was asked to stop (``App.cancel`` on a running job).
    cancel: LostFlag = field(default_factory=LostFlag)
    ctx: Context | None = None
    # Set (under ``_inflight_lock``) when an executor takes the job up: a held job not yet
    # started is one the worker leased ahead (``prefetch``), released at once on stop.
    running: bool = False
    # Set (under ``_inflight_lock``) when the stopping worker gives the unstarted job back.
    releasing: bool = False
    # Set when its success was handed over for a group commit, which frees the slot.
    acking: bool = False
    # Held while the heartbeat extends this lease and while the job settles: the two
    # never interleave, so their events' clock order is their commit order.
    beat: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class WorkerStats:
    """What one worker run did."""

    leased: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    rejected: int = 0
    cancelled: int = 0
    redelivered: int = 0
    released: int = 0
    # A burst run that ended with jobs still scheduled for later (delayed or backing off).
    scheduled_later: int = 0
    next_run_at: float | None = None


class WorkerCore:
    """A worker's options and shared state; ``Worker`` is the whole of it."""

    # Jobs leased ahead of the running ones unless ``prefetch`` says otherwise.
    default_prefetch: ClassVar[int] = DEFAULT_PREFETCH
    default_ack_window: ClassVar[float] = DEFAULT_ACK_WINDOW

    def __init__(
        self,
        app: RuntimeSource,
        *,
        concurrency: int = 1,
        prefetch: int = DEFAULT_PREFETCH,
        ack_window: float = DEFAULT_ACK_WINDOW,
        queues: Sequence[str] | None = None,
        burst: bool = False,
        burst_wait: float = 0.0,
        worker_id: str | None = None,
        poll_interval: float = 0.2,
        reap_interval: float = 1.0,
        grace_period: float = 30.0,
        observers: Sequence[Observer] = (),
        scheduler: bool = True,
        routing_refresh: float = REFRESH_SECONDS,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch < 0:
            raise ValueError("prefetch must be 0 or more")
        if ack_window < 0:
            raise ValueError("ack_window must be 0 or more")
        self.runtime = app.runtime
        # Log lines are redacted with the rules of the job type they are about.
        redact_logs_with(self.runtime.redactor_for)
        self.concurrency = concurrency
        # Leases held beyond the running jobs: the next jobs wait leased in this worker,
        # so an executor that ends one starts the next without a round trip.
        self.prefetch = prefetch
        self.capacity = concurrency + prefetch
        # The longest a success's ack waits for others to commit with (``acks.py``).
        self.ack_window = ack_window
        self.queues = list(queues) if queues else None
        self.burst = burst
        # A burst run waits for jobs due within this many seconds (delayed, retrying).
        self.burst_wait = burst_wait
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.poll_interval = poll_interval
        self.reap_interval = reap_interval
        self.grace_period = grace_period
        self.stats = WorkerStats()
        # Metrics, tracing and logs: told about attempts, and about every committed event.
        self.observers = Observers(observers)
        self._inflight: dict[int, InFlight] = {}
        self._inflight_lock = threading.Lock()
        # One thread leases at a time, so two threads never fill the same free slot.
        self._lease_lock = threading.Lock()
        self._work: queue.Queue[Any] = queue.Queue()
        # Acks gathered for the next group commit (``acks.Ack``), and their signals.
        self._acks: list[Any] = []
        self._acks_wake = threading.Condition()
        self._acks_flush = False
        self._acks_stop = False
        # Set while a thread (an executor leading a group, or the heartbeat) commits one.
        self._acks_committing = False
        # The group being committed.
        self._acks_batch: list[Any] = []
        # Executors waiting for a group to settle (``acks._lead_until``).
        self._acks_waiters = 0
        # Set while ``run()`` runs (its heartbeat thread commits acks nobody waits for);
        # outside it (``execute()`` called on its own) an ack commits at once.
        self._running_batches = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._force = threading.Event()
        # Every async handler of this worker runs on this one loop (started on first use).
        self.event_loop = EventLoopThread(f"replayq-async-{self.worker_id}")
        self._next_reap = 0.0
        self._stop_requested: float | None = None
        # The backend's wake-up listener while running (PostgreSQL LISTEN), else None.
        self.notifier: Any = None
        # Periodic jobs: every worker runs the scheduler unless told not to; the slots'
        # compare-and-set makes that safe (``queue/schedule.py``).
        schedules = self.runtime.registry.schedules
        self.scheduler = Scheduler(self.runtime, schedules) if scheduler and schedules else None
        self._next_schedule_tick = 0.0
        # Routing records (replayq rollout), read again at most every half second.
        self.router = Router(self.runtime.registry, routing_refresh)

    def _free_slots(self) -> int:
        with self._inflight_lock:
            return self.capacity - len(self._inflight)

    def _flight_of(self, job: Job) -> InFlight | None:
        """The in-flight record of this lease of ``job`` (not of a later re-lease of it)."""
        flight = self._inflight.get(job.id)
        return flight if flight is not None and flight.job.owner_token == job.owner_token else None

    def _forget(self, job: Job) -> None:
        """Free the slot of this lease; a re-lease of the same job keeps its own record."""
        with self._inflight_lock:
            if self._flight_of(job) is not None:
                del self._inflight[job.id]

    def _handler_or_none(self, job: Job) -> Handler | None:
        try:
            return self.runtime.registry.handler(job.job_type, job.handler_version)
        except UnknownJobTypeError:
            return None
