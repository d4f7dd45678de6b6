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
from typing import Any

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

    def __init__(
        self,
        app: RuntimeSource,
        *,
        concurrency: int = 1,
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
        self.runtime = app.runtime
        # Log lines are redacted with the rules of the job type they are about.
        redact_logs_with(self.runtime.redactor_for)
        self.concurrency = concurrency
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
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._force = threading.Event()
        # Set when ``run`` returns (a burst run ends without a stop): the heartbeat ends too.
        self._ended = threading.Event()
        # Wakes the heartbeat thread early: a new lease, the worker's end.
        self._beat_wake = threading.Event()
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
            return self.concurrency - len(self._inflight)

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
