"""What every part of the worker shares: its options, the in-flight table, its stats.

``WorkerCore`` holds the state the dispatcher, the executors and the heartbeat
thread read and write (under ``_inflight_lock``); the modules beside this one add
each part's methods, and ``process.Worker`` puts them together.
"""

from __future__ import annotations

import math
import os
import platform
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from msgspec import Struct, field

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
from replayq.storage.protocol import PackLearning
from replayq.storage.reconnect import Backoff
from replayq.worker.event_loop import EventLoopThread

# Put on the work queue once per executor at shutdown: the executor ends.
STOP = object()

# Jobs leased ahead of the free executors (``Worker(prefetch=...)``, ``--prefetch``),
# chosen by measurement (docs/benchmarks.md, "Batched claims and grouped acks").
DEFAULT_PREFETCH = 8
# The longest a success's ack waits in memory for others to commit with (seconds).
DEFAULT_ACK_WINDOW = 0.005
# Jobs are leased ahead only as many as the executors finish in this many seconds at the
# pace of the recent jobs: short jobs are batched, long ones are left to idle workers.
DEFAULT_PREFETCH_WINDOW = 0.1
# Queued jobs should start within this many seconds: a sleeping executor is woken for them
# only as far as the awake ones would not start them so soon at the recent pace, and one
# is woken when queued jobs saw none taken for this long (a job far longer than the pace).
START_WITHIN = 0.005


class InFlight(Struct):
    """A job this worker holds a lease on."""

    job: Job
    lease_seconds: float
    heartbeat_seconds: float
    next_heartbeat: float
    # When the lease was asked for (monotonic, before its statement was sent).
    started: float
    # Until when the lease is surely held, in the clock of ``WorkerCore._lease_clock``: read
    # before the statement that granted or last extended it was sent, plus its length, so it
    # errs early. ``-inf`` once a heartbeat found the lease lost. A held job is started only
    # before it (``Executing._start``); past it, the lease is renewed first.
    held_until: float = math.inf
    lost: LostFlag = field(default_factory=LostFlag)
    # Set by the heartbeat when the job was asked to stop (``App.cancel`` on a running job)
    # or its lease was found lost (after ``lost``): the handler's cancel points read it.
    cancel: LostFlag = field(default_factory=LostFlag)
    ctx: Context | None = None
    # Set (under ``_inflight_lock``) when an executor (or ``execute()``) takes the job up: a
    # held job not yet started is one leased ahead (``prefetch``), given back at once when
    # the worker stops.
    running: bool = False
    # Set (under ``_inflight_lock``) when the worker gives the unstarted job back (it stops,
    # or the job's start raised).
    releasing: bool = False
    # Set when its success waits in memory for a group commit: it keeps its slot and its
    # lease is still heartbeated until the ack commits.
    acking: bool = False
    # Set under ``beat`` once the job's settle (or its group's ack) committed: no beat
    # extends its lease after, while its executor tells the observers and forgets it.
    ended: bool = False
    # Held while the heartbeat extends this lease and while the job settles: the two
    # never interleave, so their events' clock order is their commit order.
    beat: threading.Lock = field(default_factory=threading.Lock)
    # The job's handler as looked up when the lease was held (``None``: no handler for
    # its type and version): the attempt runs it without a second registry lookup.
    handler: Handler | None = None


class WorkerStats(Struct):
    """What one worker run did."""

    leased: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    rejected: int = 0
    cancelled: int = 0
    redelivered: int = 0
    released: int = 0
    # Held jobs not started because their lease was found lost (reaped while the worker
    # stalled): dropped unrun, the job is the new holder's.
    lost: int = 0
    # A burst run that ended with jobs still scheduled for later (delayed or backing off).
    scheduled_later: int = 0
    next_run_at: float | None = None


class WorkerCore:
    """A worker's options and shared state; ``Worker`` is the whole of it."""

    default_prefetch: ClassVar[int] = DEFAULT_PREFETCH
    default_ack_window: ClassVar[float] = DEFAULT_ACK_WINDOW
    default_prefetch_window: ClassVar[float] = DEFAULT_PREFETCH_WINDOW

    def __init__(
        self,
        app: RuntimeSource,
        *,
        concurrency: int = 1,
        prefetch: int = DEFAULT_PREFETCH,
        ack_window: float = DEFAULT_ACK_WINDOW,
        prefetch_window: float = DEFAULT_PREFETCH_WINDOW,
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
        if prefetch_window < 0:
            raise ValueError("prefetch_window must be 0 or more")
        self.runtime = app.runtime
        # A storage whose trace packs deflate against dictionaries learned per job type
        # (SQLite), told of each attempt started and each success acked; looked up at the
        # first (``_pack_learning``): the storage opens on first use, which may be later.
        self._learning: PackLearning | None = None
        self._learning_of: object = None
        # Log lines are redacted with the rules of the job type they are about.
        redact_logs_with(self.runtime.redactor_for)
        self.concurrency = concurrency
        # Leases held beyond the running jobs: an executor that ends one job starts the
        # next without a round trip. Jobs with a fixed visibility timeout (heartbeat 0)
        # are never leased ahead: their window counts from their lease.
        self.prefetch = prefetch
        self.capacity = concurrency + prefetch
        self.ack_window = ack_window
        # At most as many jobs ahead as the executors finish in this many seconds at the
        # recent pace (``inf``: always ``prefetch``), so that a worker busy with long jobs
        # does not hold jobs an idle worker could run (the prefetch problem).
        self.prefetch_window = prefetch_window
        # The recent attempts' mean seconds (a moving average); None before the first.
        self._job_seconds: float | None = None
        self.queues = list(queues) if queues else None
        self.burst = burst
        # A burst run waits for jobs due within this many seconds (delayed, retrying).
        self.burst_wait = burst_wait
        # platform.node() is the host name, as socket.gethostname(): importing socket (its
        # enums) cost an SQLite worker 13M instructions at start, for this one call.
        self.worker_id = worker_id or f"{platform.node()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
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
        # Set under ``_lease_lock`` when ``run()`` winds down (stop, or a burst run's end):
        # from then on no thread leases, so no lease lands after the worker let go of it.
        self._leasing_closed = False
        # Held by the executor that commits the waiting acks and leases the free slots
        # (``Executing._next_work``): the others wait for the jobs it brings.
        self._refilling = threading.Lock()
        # Leased jobs for the executors. A ``SimpleQueue`` (C): a put and a get with no
        # Python ``Condition`` to notify, twice per job. Executors do not wait on it: an
        # executor with nothing to run sleeps (``_next_queued``), woken by ``_hand_out``
        # only as many as the jobs need.
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # The sleeping executors' bells (under ``_sleep``): each a lock its executor holds
        # and waits to acquire again, released to wake it; the last to sleep wakes first.
        # Plain locks (C), not a ``Condition``, whose Python a wake-up pays for.
        self._sleep = threading.Lock()
        self._sleepers: list[Any] = []
        # Items taken off ``_work``: the acks thread's watch compares it between two looks
        # (``_watch_queue``). Counted without a lock: a lost count costs a spare wake-up.
        self._taken = 0
        # When (monotonic; inf: not watching) the acks thread next looks whether queued
        # jobs beside sleeping executors were taken since ``_watch_taken`` (under
        # ``_acks_lock``).
        self._watch_at = math.inf
        self._watch_taken = 0
        # Successes waiting in memory for their group commit (``acks.Ack``).
        self._acks: list[Any] = []
        self._acks_lock = threading.Lock()
        # An outage met by group commits, logged as the other loops log theirs: once as it
        # starts (per cause), once as it ends; each group's retry a debug record.
        self._acks_outage = Backoff(f"worker {self.worker_id}: acks")
        self._acks_outage_lock = threading.Lock()
        self._acks_wake = threading.Event()
        # Whether the acks thread knows of the buffered acks (sleeps until their window ends).
        self._acks_armed = False
        # When the sleeping acks thread wakes by itself (monotonic; 0: awake), and when an
        # executor last asked it to commit the buffer (``acks._arm_acks``).
        self._acks_wake_at = 0.0
        self._acks_last_armed = -math.inf
        # Set while ``run()`` runs: outside it (``execute()`` on its own) an ack commits at once.
        self._grouping = False
        # Per executor thread: the id of the job whose ack it left for a group commit, which
        # then tells the observers the attempt settled (``Executing._execute``).
        self._deferred = threading.local()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._force = threading.Event()
        # Set when ``run`` returns (a burst run ends without a stop): the heartbeat ends too.
        self._ended = threading.Event()
        # Wakes the heartbeat thread early: a new lease due before its wake-up, the end.
        self._beat_wake = threading.Event()
        # When the sleeping heartbeat thread wakes by itself (monotonic; under the lock).
        self._beat_wake_at = 0.0
        # Every async handler of this worker runs on this one loop (started on first use).
        self.event_loop = EventLoopThread(f"replayq-async-{self.worker_id}")
        self._next_reap = 0.0
        # Expired leases (job id, owner token) whose reaping, and parking, a constraint of
        # replayq's own tables refused (``Reaping.reap``): skipped by this worker's reaper.
        self._unreapable: set[tuple[int, str]] = set()
        # The local clock a lease's ``held_until`` is read in. With the database's clock
        # judging leases (``Runtime.leases_by_database``) the worker cannot read that clock
        # without a round trip: the monotonic clock stands in, read before each grant or
        # extension is sent, so that a bound from it ends no later than the database's
        # deadline. Otherwise the app's clock judges leases, and is read itself.
        self._leases_monotonic = self.runtime.leases_by_database
        self._lease_clock = time.monotonic if self._leases_monotonic else self.runtime.clock.now
        self._stop_requested: float | None = None
        # Start errors (``Executing._unstartable``): till when (monotonic) this worker leases
        # nothing after one, its jobs given back meanwhile free for other workers; the
        # backoff that grows it, reset by a start that succeeds; the jobs whose start
        # raised on their last leases here: (times in a row, ``_starts`` at the first, the
        # attempt those leases had: another means it was started somewhere since);
        # how many jobs this worker started (counted without a lock: a lost count only
        # delays a park by a start error); the jobs given back after a start error that
        # this worker's next lease passes over (``Leasing._skips_taken``; under
        # ``_inflight_lock``), and whether its last lease passed over any.
        self._starts_paused_until = 0.0
        self._start_backoff: Backoff | None = None
        self._start_errors: dict[int, tuple[int, int, int]] = {}
        self._starts = 0
        self._skip_once: set[int] = set()
        self._lease_skipped = False
        # The backend's wake-up listener while running (PostgreSQL LISTEN), else None.
        self.notifier: Any = None
        # Periodic jobs: every worker runs the scheduler unless told not to; the slots'
        # compare-and-set makes that safe (``queue/schedule.py``).
        schedules = self.runtime.registry.schedules
        self.scheduler = Scheduler(self.runtime, schedules) if scheduler and schedules else None
        self._next_schedule_tick = 0.0
        # Routing records (replayq rollout), read again at most every half second.
        self.router = Router(self.runtime.registry, routing_refresh)

    def _pack_learning(self) -> PackLearning | None:
        """The storage as ``PackLearning`` (SQLite), or ``None``; asked once per storage
        (the protocol check is slow): the app's storage is a new one after ``App.close()``,
        and the closed one would learn nothing for the rest of the run."""
        storage = self.runtime.storage
        if storage is not self._learning_of:
            self._learning = storage if isinstance(storage, PackLearning) else None
            self._learning_of = storage
        return self._learning

    def _free_slots(self) -> int:
        # An ack waiting in memory keeps its slot: the group commit that acks it leases
        # the slot again in the same transaction (no other lease takes it meanwhile).
        with self._inflight_lock:
            return self.capacity - len(self._inflight)

    def _idle(self) -> bool:
        """Nothing held at all, not even an ack waiting in memory."""
        with self._inflight_lock:
            return not self._inflight

    def _flight_of(self, job: Job) -> InFlight | None:
        """The in-flight record of this lease of ``job`` (not of a later re-lease of it)."""
        flight = self._inflight.get(job.id)
        return flight if flight is not None and flight.job.owner_token == job.owner_token else None

    def _forget(self, job: Job) -> None:
        """Free the slot of this lease; a re-lease of the same job keeps its own record."""
        self._forget_all((job,))

    def _forget_all(self, jobs: Sequence[Job]) -> None:
        """``_forget`` for several leases, under one hold of the lock."""
        with self._inflight_lock:
            for job in jobs:
                if self._flight_of(job) is not None:
                    del self._inflight[job.id]

    def _ran(self, job: Job) -> None:
        """An executor is done with this lease: forget it, unless its ack waits in memory
        (the group commit forgets it, and the heartbeat covers it until then)."""
        with self._inflight_lock:
            flight = self._flight_of(job)
            if flight is not None and not flight.acking:
                del self._inflight[job.id]

    # -- handing jobs to the executors ------------------------------------------------------

    def _hand_out(self, items: Sequence[Any], *, everyone: bool = False) -> None:
        """Queue jobs (or ``STOP``) for the executors and wake as many sleeping ones as
        they need (``everyone``: all of them).

        Each wake-up is a thread hand-off: two context switches, and the GIL passed back
        and forth with the waker while it talks to the database. Short jobs (at the recent
        pace) are left to the executors awake, which take them as they finish: a drain of
        no-op jobs on four executors runs mostly on one, with a third of the context
        switches a job. Jobs of unknown pace wake every sleeper; queued jobs that see none
        taken for ``START_WITHIN`` wake one more (``_watch_queue``).
        """
        for item in items:
            self._work.put(item)
        with self._sleep:
            sleepers = self._sleepers
            if not sleepers:
                return
            wake = len(sleepers) if everyone else self._wanted(self._work.qsize())
            for _ in range(wake):
                sleepers.pop().release()
            left_asleep = bool(sleepers)
        if left_asleep:
            self._watch_queue_from(time.monotonic())

    def _wanted(self, queued: int) -> int:
        """How many sleeping executors ``queued`` jobs need (under ``_sleep``): those the
        awake ones would not start within ``START_WITHIN`` at the recent pace."""
        sleeping = len(self._sleepers)
        seconds = self._job_seconds
        if seconds is None:
            return sleeping
        awake = self.concurrency - sleeping
        needed = max(1, math.ceil(queued * seconds / START_WITHIN))
        return max(0, min(sleeping, needed - awake))

    def _next_queued(self) -> Any:
        """The next queued job (or ``STOP``), asleep until one is handed to this executor."""
        while True:
            with self._sleep:
                # Looked at under the lock ``_hand_out`` counts the sleepers under: a job
                # queued after this look finds this executor's bell, and rings it.
                bell = None
                if self._work.empty():
                    bell = threading.Lock()
                    bell.acquire()
                    self._sleepers.append(bell)
            if bell is not None:
                bell.acquire()  # until ``_hand_out`` or the watch releases it
                continue
            try:
                item = self._work.get_nowait()
            except queue.Empty:  # another executor took it since the look
                continue
            self._taken += 1
            return item

    def _watch_queue_from(self, now: float) -> None:
        """Have the acks thread look at the queue ``START_WITHIN`` from ``now``: jobs were
        left queued beside sleeping executors, and an awake one may be in a long job."""
        with self._acks_lock:
            if not math.isinf(self._watch_at):
                return  # watching already: its next look sees these jobs too
            self._watch_at = now + START_WITHIN
            self._watch_taken = self._taken
            # The acks thread sleeps until ``_acks_wake_at`` (0: awake, it looks anyway):
            # woken only if that is later (in a busy worker it wakes every ``ack_window``).
            if self._acks_wake_at <= self._watch_at:
                return
        self._acks_wake.set()

    def _watch_queue(self, now: float) -> float:
        """(The acks thread, under ``_acks_lock``.) Wake a sleeping executor if the
        queued jobs saw none taken since the last look; when to look next (inf: nothing
        left to watch)."""
        if now < self._watch_at:
            return self._watch_at
        with self._sleep:
            if self._sleepers and not self._work.empty():
                if self._taken == self._watch_taken:
                    self._sleepers.pop().release()
                self._watch_at = now + START_WITHIN
                self._watch_taken = self._taken
            else:
                self._watch_at = math.inf
        return self._watch_at

    def _handler_or_none(self, job: Job) -> Handler | None:
        try:
            return self.runtime.registry.handler(job.job_type, job.handler_version)
        except UnknownJobTypeError:
            return None
