"""The worker: lease, heartbeat, run, classify, retry or bury, ack after commit, reap.

One dispatcher thread leases jobs in batches (up to the free slots) and hands
them to ``concurrency`` executor threads; on a busy queue an executor whose job
succeeds leases its slot's next job in the ack's own transaction (one commit per
job). A heartbeat thread extends the lease
of every job in flight. Every write about a job is a compare-and-set on (job
id, owner token): a worker that lost its lease cannot change the job's state.
The dispatcher also runs the scheduler of the app's periodic jobs (off with
``scheduler=False``, ``--no-scheduler``) between its looks for work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from replayq import codec
from replayq.errors import (
    DatabaseUnavailableError,
    EffectInDoubtError,
    FailureClass,
    JobCancelledError,
    JobError,
    LeaseLostError,
    PayloadError,
    ReplayqError,
    StorageError,
    UnknownJobTypeError,
    classify,
)
from replayq.model import DeadReason, Job, TraceEvent
from replayq.observe.hooks import Observer, Observers
from replayq.queue import lifecycle as trace
from replayq.queue.catalog import register_contracts
from replayq.queue.handlers import Handler
from replayq.queue.scheduler import Scheduler
from replayq.recording.context import Context
from replayq.recording.ledger import ledger_loader
from replayq.recording.world import LiveWorld, LostFlag
from replayq.rollout.router import REFRESH_SECONDS, Router
from replayq.rollout.shadow import compare_attempt
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import (
    IdemFilter,
    JobBury,
    JobCancelRunning,
    JobComplete,
    JobLease,
    JobRedeliver,
    JobRetry,
    JobRoute,
    LeaseExtend,
    LeaseRelease,
    Listener,
    TraceQuery,
    Transaction,
)
from replayq.storage.reconnect import Backoff

log = logging.getLogger("replayq.worker")

_STOP = object()
_SETTLE_STORAGE_TRIES = 5


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


class Worker:
    """Runs jobs of an ``App``. ``run()`` blocks until stopped (or, with ``burst``, idle)."""

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
        self._loops = threading.local()
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

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop leasing; in-flight jobs get ``grace_period`` to finish, then are released."""
        if self._stopping.is_set():
            self._force.set()
        else:
            self._stop_requested = time.monotonic()  # the grace period counts from here
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("worker %s: signal %s, shutting down", self.worker_id, signum)
        self.stop()

    def run(self) -> WorkerStats:
        """Lease and run jobs until stopped; returns what this run did."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if not self._register_contracts():
            return self.stats
        executors = [
            threading.Thread(target=self._executor, name=f"replayq-exec-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        heartbeat = threading.Thread(target=self._heartbeat, name="replayq-heartbeat", daemon=True)
        if self.observers.members:
            self.runtime.add_tap(self.observers.events)
        for thread in [*executors, heartbeat]:
            thread.start()
        # Optional storage capability: backends that push wake-ups (PostgreSQL LISTEN).
        storage = self.runtime.storage
        self.notifier = storage.listen(self._on_notify) if isinstance(storage, Listener) else None
        try:
            self._dispatch()
        finally:
            if self.notifier is not None:
                self.notifier.close()
            self._shutdown(executors)
            if self.observers.members:
                self.runtime.remove_tap(self.observers.events)
        return self.stats

    def _register_contracts(self) -> bool:
        """Store contracts and schedules, waiting out an unavailable database; False: stopped.

        A worker started while the database is locked, full or restarting waits for it
        like a running one does, rather than exiting for its supervisor to restart.
        """
        backoff = Backoff(f"worker {self.worker_id}: start")
        while True:
            try:
                register_contracts(self.runtime)
                if self.scheduler is not None:
                    self.scheduler.register()
            except DatabaseUnavailableError as exc:
                if not backoff.wait(exc, self._stopping):
                    return False
                continue
            backoff.reset()
            return True

    def _on_notify(self, queue_name: str | None) -> None:
        """A backend wake-up: a job became ready on ``queue_name`` (``None``: look anyway)."""
        if queue_name is None or self.queues is None or queue_name in self.queues:
            self._wake.set()

    # -- dispatcher -------------------------------------------------------------------------

    def _free_slots(self) -> int:
        with self._inflight_lock:
            return self.concurrency - len(self._inflight)

    def _dispatch(self) -> None:
        backoff = Backoff(f"worker {self.worker_id}: lease/reap")
        while not self._stopping.is_set():
            now = self.runtime.clock.now()
            try:
                if now >= self._next_reap:
                    self.reap()
                    self._next_reap = now + self.reap_interval
                if self.scheduler is not None and now >= self._next_schedule_tick:
                    due = self.scheduler.tick()
                    self._next_schedule_tick = due if due is not None else now + 60.0
                free, jobs = self._lease_free_slots()
            except StorageError as exc:
                # Killed session, restart, partition: retry until the database is back or we
                # are told to stop. A claim whose commit was lost is reaped after its lease.
                backoff.wait(exc, self._stopping)
                continue
            backoff.reset()
            if jobs:
                continue
            if self.burst and free == self.concurrency and self._burst_done(now):
                return
            wait = self.poll_interval
            if self.scheduler is not None:
                wait = max(0.0, min(wait, self._next_schedule_tick - now))
            self._wake.wait(wait)
            self._wake.clear()

    def _burst_done(self, now: float) -> bool:
        """Whether a burst run may end: nothing is due within ``burst_wait`` seconds.

        Leaving, it notes in ``stats`` how many jobs are scheduled later, so the caller
        can say so instead of implying the queue is empty.
        """
        try:
            with self.runtime.storage.transaction(readonly=True) as tx:
                count, next_run_at = tx.job_scheduled(now, self.queues)
        except StorageError:
            return False  # the next lease meets the outage and backs off
        if next_run_at is not None and next_run_at - now <= self.burst_wait:
            return False
        self.stats.scheduled_later, self.stats.next_run_at = count, next_run_at
        return True

    def _lease_free_slots(self) -> tuple[int, list[Job]]:
        """Lease up to the number of free slots; returns (free slots before, jobs leased)."""
        with self._lease_lock:
            free = self._free_slots()
            return free, (self.lease(free) if free > 0 else [])

    def _lease_params(self, limit: int) -> JobLease:
        handlers = {t: self.runtime.registry.handler(t) for t in self.runtime.registry.job_types()}
        # A routed type's new jobs are leased without a version and routed below, one by one.
        routed = self.router.routed_types()
        return JobLease(
            worker_id=self.worker_id,
            owner_token=uuid.uuid4().hex,
            now=self.runtime.clock.now(),
            hlc=self.runtime.hlc.tick(),
            limit=limit,
            default_lease_seconds=30.0,
            lease_for={t: h.contract.lease for t, h in handlers.items()},
            version_for={t: h.contract.version for t, h in handlers.items() if t not in routed},
            queues=self.queues,
        )

    def lease(self, limit: int) -> list[Job]:
        """Lease up to ``limit`` jobs and queue them for the executors."""
        with self.runtime.storage.transaction() as tx:
            jobs, now = self._lease_in(tx, limit)
        self._hold(jobs, now)
        return jobs

    def _lease_in(
        self, tx: Transaction, limit: int, also: Sequence[TraceEvent] = ()
    ) -> tuple[list[Job], float]:
        """Lease up to ``limit`` jobs inside ``tx`` with their ``job.leased`` events.

        ``also``: events of the same transaction appended before those (one insert
        batch). Returns (jobs, lease time). The caller hands them to ``_hold`` once
        ``tx`` has committed, never before: a rolled-back lease holds nothing.
        """
        self.router.refresh(tx)
        params = self._lease_params(limit)
        routed = [self._routed(tx, job, params.owner_token) for job in tx.job_lease(params)]
        jobs = [job for job, _ in routed]
        events = list(also)
        for job, moved_from in routed:
            self.runtime.hlc.observe(job.hlc)
            # A job whose routing no longer names its version (rolled back): the trace says so.
            moved: dict[str, Any] = {"version_moved_from": moved_from} if moved_from else {}
            events.append(
                trace.lifecycle(
                    trace.JOB_LEASED,
                    job,
                    now=params.now,
                    hlc=self.runtime.hlc.tick(),
                    worker_id=self.worker_id,
                    status="running",
                    owner_token=params.owner_token,
                    lease_deadline=job.lease_deadline,
                    version=job.handler_version,
                    redelivery_count=job.redelivery_count,
                    **moved,
                )
            )
        tx.trace_append(events)
        return jobs, params.now

    def _routed(self, tx: Transaction, job: Job, owner_token: str) -> tuple[Job, str | None]:
        """The leased job with its version (kept from its first lease, else chosen now),
        and the version it was moved from, if it had one its routing no longer names."""
        version = self.router.choose(job)
        if version is None or not tx.job_transition(JobRoute(job.id, owner_token, version)):
            return job, None
        return job.evolve(handler_version=version), job.handler_version

    def _hold(self, jobs: Sequence[Job], now: float) -> None:
        """Jobs whose lease committed: track them for heartbeats and queue them to run."""
        for job in jobs:
            lease_seconds = (job.lease_deadline or now) - now
            handler = self._handler_or_none(job)
            beat = handler.contract.heartbeat if handler else lease_seconds / 3
            # heartbeat 0: a fixed visibility timeout, the lease is never extended.
            first_beat = time.monotonic() + beat if beat > 0 else float("inf")
            with self._inflight_lock:
                self._inflight[job.id] = InFlight(
                    job, lease_seconds, beat, first_beat, time.monotonic()
                )
            self.observers.job_seen(job)
            self._work.put(job)
        self.stats.leased += len(jobs)

    def reap(self) -> int:
        """Re-queue jobs whose lease expired (counted as re-deliveries); bury exhausted ones."""
        now = self.runtime.clock.now()
        count = 0
        with self.runtime.storage.transaction() as tx:
            for job in tx.lease_reap(now, 100):
                self.runtime.hlc.observe(job.hlc)
                self.observers.job_seen(job)
                log.warning(
                    "worker %s: job %s lease of %s expired; %s",
                    self.worker_id,
                    job.id,
                    job.worker_id,
                    "attempts exhausted" if job.attempt >= job.max_attempts else "re-delivered",
                )
                expired = trace.lifecycle(
                    trace.LEASE_EXPIRED,
                    job,
                    now=now,
                    hlc=self.runtime.hlc.tick(),
                    worker_id=self.worker_id,
                    expired_owner=job.worker_id,
                    owner_token=job.owner_token,
                    lease_deadline=job.lease_deadline,
                    overdue=now - (job.lease_deadline or now),
                )
                assert job.owner_token is not None
                hlc = self.runtime.hlc.tick()
                if job.cancel_requested_at is not None:
                    if tx.job_transition(JobCancelRunning(job.id, job.owner_token, now, hlc)):
                        cancelled = self._cancel_event(
                            tx, job, now, hlc, "the lease ran out before a step boundary"
                        )
                        tx.trace_append([expired, cancelled])
                        count += 1
                elif job.attempt >= job.max_attempts:
                    reason = DeadReason.LEASE_EXPIRED_ATTEMPTS_EXHAUSTED
                    if tx.job_transition(
                        JobBury(job.id, job.owner_token, now, reason, None, "lease expired", hlc)
                    ):
                        tx.trace_append(
                            [
                                expired,
                                trace.lifecycle(
                                    trace.JOB_DEAD,
                                    job,
                                    now=now,
                                    hlc=hlc,
                                    worker_id=self.worker_id,
                                    status="dead",
                                    reason=reason.value,
                                ),
                            ]
                        )
                        count += 1
                elif tx.job_transition(JobRedeliver(job.id, job.owner_token, now, hlc)):
                    tx.trace_append(
                        [
                            expired,
                            trace.lifecycle(
                                trace.JOB_REDELIVERED,
                                job,
                                now=now,
                                hlc=hlc,
                                worker_id=self.worker_id,
                                status="queued",
                                redelivery_count=job.redelivery_count + 1,
                            ),
                        ]
                    )
                    count += 1
        self.stats.redelivered += count
        return count

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        backoff = Backoff(f"worker {self.worker_id}: heartbeat")
        while not (self._stopping.is_set() and self._free_slots() == self.concurrency):
            with self._inflight_lock:
                due = [f for f in self._inflight.values() if f.next_heartbeat <= time.monotonic()]
            if due:
                try:
                    self.extend_leases(due)
                    backoff.reset()
                except DatabaseUnavailableError as exc:
                    # Beat again after the backoff; an outage longer than the lease gets the
                    # jobs reaped, and their late settle is then rejected (fenced).
                    retry_at = time.monotonic() + backoff.next_delay(exc)
                    for flight in due:
                        flight.next_heartbeat = min(flight.next_heartbeat, retry_at)
                except ReplayqError:
                    log.exception("worker %s: heartbeat failed", self.worker_id)
            time.sleep(0.05)

    def extend_leases(self, flights: Sequence[InFlight]) -> None:
        """Extend the given leases; a failed compare-and-set marks the lease lost."""
        now = self.runtime.clock.now()
        with self.runtime.storage.transaction() as tx:
            events = []
            asked_to_stop = tx.job_cancel_requested(self.worker_id)
            for flight in flights:
                job = flight.job
                assert job.owner_token is not None
                if job.id in asked_to_stop:
                    # Not extended: a handler that reaches no step boundary within the
                    # lease is cancelled by the reaper, its late writes fenced.
                    if not flight.cancel.is_set():
                        log.info("job %s: asked to stop; it stops at its next step", job.id)
                    flight.cancel.set()
                    flight.next_heartbeat = time.monotonic() + flight.heartbeat_seconds
                    continue
                extended = tx.job_transition(
                    LeaseExtend(job.id, job.owner_token, now, flight.lease_seconds)
                )
                name = trace.LEASE_EXTENDED if extended else trace.LEASE_LOST
                events.append(
                    trace.lifecycle(
                        name,
                        job,
                        now=now,
                        hlc=self.runtime.hlc.tick(),
                        worker_id=self.worker_id,
                        lease_deadline=now + flight.lease_seconds if extended else None,
                    )
                )
                flight.next_heartbeat = time.monotonic() + flight.heartbeat_seconds
                if not extended:
                    flight.lost.set()
            tx.trace_append(events)
        for flight in flights:
            if flight.ctx is not None and flight.ctx.locks.held and not flight.lost.is_set():
                flight.ctx.locks.renew_all()

    # -- executors --------------------------------------------------------------------------

    def _executor(self) -> None:
        item = self._work.get()
        while item is not _STOP:
            try:
                self._execute(item, refill=True)
            except Exception:
                log.exception("worker %s: job %s could not be settled", self.worker_id, item.id)
            finally:
                self._forget(item)
            item = self._next_work()

    def _flight_of(self, job: Job) -> InFlight | None:
        """The in-flight record of this lease of ``job`` (not of a later re-lease of it)."""
        flight = self._inflight.get(job.id)
        return flight if flight is not None and flight.job.owner_token == job.owner_token else None

    def _forget(self, job: Job) -> None:
        """Free the slot of this lease; a re-lease of the same job keeps its own record."""
        with self._inflight_lock:
            if self._flight_of(job) is not None:
                del self._inflight[job.id]

    def _next_work(self) -> Any:
        """The next job for an executor that just freed its slot.

        With work queued locally, that; else the executor leases for the free
        slots itself, so a busy queue costs no thread hand-off per job (on a
        2-vCPU VM each wake-up of the dispatcher cost ~0.3 ms, more than the
        job's SQL). Only when nothing was leased is the dispatcher woken (to
        poll, reap, or end a burst run).
        """
        try:
            return self._work.get_nowait()
        except queue.Empty:
            pass
        leased: list[Job] = []
        if not self._stopping.is_set():
            try:
                _, leased = self._lease_free_slots()
            except Exception:
                # Never let an executor thread die: the dispatcher leases (with backoff) instead.
                log.exception("worker %s: lease from an executor failed", self.worker_id)
        if not leased:
            self._wake.set()
        return self._work.get()

    def _handler_or_none(self, job: Job) -> Handler | None:
        try:
            return self.runtime.registry.handler(job.job_type, job.handler_version)
        except UnknownJobTypeError:
            return None

    def _loop(self) -> asyncio.AbstractEventLoop:
        """This executor thread's event loop, for ``async def`` handlers."""
        loop: asyncio.AbstractEventLoop | None = getattr(self._loops, "loop", None)
        if loop is None:
            loop = self._loops.loop = asyncio.new_event_loop()
        return loop

    def execute(self, job: Job) -> None:
        """Run one leased job to a settled state (succeeded, retry scheduled, or dead)."""
        self._execute(job, refill=False)

    def _execute(self, job: Job, *, refill: bool) -> None:
        """``execute``; with ``refill``, a success leases this slot's next job in its ack."""
        with self.observers.attempt(job, self.worker_id):
            self._attempt(job, refill=refill)

    def _attempt(self, job: Job, *, refill: bool) -> None:
        flight = self._flight_of(job)
        handler = self._handler_or_none(job)
        if handler is None:
            self._bury(
                job,
                DeadReason.UNKNOWN_JOB_TYPE,
                None,
                f"no handler for job type {job.job_type!r} on worker {self.worker_id}",
            )
            return
        try:
            handler.shape.check(job.job_type, job.payload)
        except PayloadError as exc:
            self._bury(job, DeadReason.MALFORMED_PAYLOAD, FailureClass.VALIDATION, str(exc))
            return
        # Only a later attempt can find steps an earlier one committed.
        steps = ledger_loader(self.runtime, job.id) if job.attempt > 1 else None
        world = LiveWorld(flight.lost if flight is not None else None, steps)
        ctx = Context(
            self.runtime,
            job,
            handler,
            worker_id=self.worker_id,
            world=world,
            owner_token=job.owner_token,
            cancel=flight.cancel if flight is not None else None,
        )
        if flight is not None:
            flight.ctx = ctx
        started = time.monotonic()
        try:
            result = ctx.run(self._loop if handler.is_async else None)
            result_json = codec.dumps(result, what=f"{job.job_type} result")
        except LeaseLostError as exc:
            # A commit or effect claim was fenced: another worker holds the job now. The
            # attempt ends here; only its events (with ``write.fenced``) are kept.
            self._reject(job, exc, ctx)
            return
        except JobCancelledError as exc:
            self._cancelled(job, ctx, str(exc), time.monotonic() - started)
            return
        except Exception as exc:
            ctx.discard_writes()
            self._fail(job, handler, ctx, exc, time.monotonic() - started)
            self._compare(job, handler)
            return
        if ctx.cancelled:
            # The handler saw ``ctx.cancelled`` and returned: the attempt still ends cancelled,
            # and what it did outside a step is not committed.
            self._cancelled(job, ctx, "the handler returned after the cancel", 0.0)
            return
        try:
            self._succeed(job, handler, ctx, result_json, time.monotonic() - started, refill)
        except JobError as exc:
            # The final commit refused the handler's writes made outside steps (a version
            # conflict, a stale fencing token): a failure of the attempt, classified.
            # Any other storage error leaves the job running: it is reaped after its lease
            # and runs again, never buried for the database's fault.
            ctx.discard_writes()
            self._fail(job, handler, ctx, exc, time.monotonic() - started)
        self._compare(job, handler)

    def _compare(self, job: Job, handler: Handler) -> None:
        """Shadow and dual-run: the candidate re-runs this settled attempt, sealed.

        Only the authoritative run made real effects; the candidate gets its recorded
        answers (observe-only) and the comparison is stored for ``rollout status``.
        """
        for mode, version in self.router.comparisons_for(job, handler.contract.version):
            try:
                compare_attempt(self.runtime, job, version, mode=mode)
            except Exception:  # a comparison never fails the job it observes
                log.exception("job %s: %s run of %s failed", job.id, mode, version)

    def _settle(self, job: Job, write: Any, ctx: Context | None = None) -> bool:
        """Run ``write(tx)`` in one transaction; a lost lease rolls it all back and is traced.

        On a lost lease the attempt's domain events are still kept (the record of
        what the late worker did), but none of its writes. While the database is
        unreachable the write is retried with backoff: it is a compare-and-set on
        the owner token, so a retry after the lease was reaped is rejected, never
        applied. At the end of the shutdown grace it gives up; the job, still
        ``running``, is reaped after its lease.
        """
        backoff = Backoff(f"worker {self.worker_id}: settle job {job.id}")
        outcome_unknown = False
        failures = 0
        while True:
            try:
                try:
                    with self.runtime.storage.transaction() as tx:
                        write(tx)
                    return True
                except LeaseLostError as exc:
                    if outcome_unknown and self._settled_by_this_attempt(job):
                        return True  # an earlier try committed; only its reply was lost
                    self._reject(job, exc, ctx)
                    return False
            except DatabaseUnavailableError as exc:
                outcome_unknown = True  # the connection may have died after COMMIT was sent
                if not backoff.wait(exc, self._force):
                    log.warning(
                        "worker %s: gave up settling job %s at shutdown; it stays running "
                        "and is reaped after its lease",
                        self.worker_id,
                        job.id,
                    )
                    return False
            except StorageError as exc:
                # Rolled back for sure (e.g. SQLite's write lock held past busy_timeout):
                # try a few times, then leave the job running to be reaped and re-run.
                failures += 1
                if failures >= _SETTLE_STORAGE_TRIES or not backoff.wait(exc, self._force):
                    log.error(
                        "worker %s: could not settle job %s (%s); it stays running and is "
                        "reaped after its lease",
                        self.worker_id,
                        job.id,
                        exc,
                    )
                    return False

    def _settled_by_this_attempt(self, job: Job) -> bool:
        """Whether this attempt's settle committed: its terminal event is in the trace.

        A settle's state change and its event commit in one transaction, so the
        event (this worker, this attempt) proves the state change landed.
        """
        settled = {trace.JOB_SUCCEEDED, trace.RETRY_SCHEDULED, trace.JOB_DEAD}
        with self.runtime.storage.transaction(readonly=True) as tx:
            return any(
                e.name in settled
                and e.data.get("owner_token") == job.owner_token
                and e.attempt == job.attempt
                for e in tx.trace_query(TraceQuery(job_id=job.id))
            )

    def _reject(self, job: Job, exc: LeaseLostError, ctx: Context | None) -> None:
        """Trace a write refused because the lease is gone, with the attempt's events."""
        now = self.runtime.clock.now()
        flight = self._inflight.get(job.id)
        # The attempt's duration and version count in the observed p99 (contract lint):
        # the runs that outlive their lease are the ones the lease must be sized for.
        duration = time.monotonic() - flight.started if flight is not None else None
        version = ctx.handler.contract.version if ctx is not None else None
        with self.runtime.storage.transaction() as tx:
            if ctx is not None:
                refused = ctx.pending_writes()
                if refused:  # writes made outside steps, refused with the ack
                    ctx.record_fenced(refused, at="ack")
                ctx.discard_writes()
                ctx.flush(tx, failed=True)
            tx.trace_append(
                [
                    trace.lifecycle(
                        trace.WRITE_REJECTED,
                        job,
                        now=now,
                        hlc=self.runtime.hlc.tick(),
                        worker_id=self.worker_id,
                        status="rejected",
                        reason="owner token no longer holds the lease",
                        attempted=str(exc),
                        duration=duration,
                        version=version,
                    )
                ]
            )
        self.stats.rejected += 1
        log.warning("job %s: settle refused, the lease was taken by another worker", job.id)

    def _succeed(
        self,
        job: Job,
        handler: Handler,
        ctx: Context,
        result_json: str,
        duration: float,
        refill: bool = False,
    ) -> None:
        """Ack ``job`` with the handler's pending writes and its ``job.succeeded`` event.

        With ``refill`` (an executor loop, the worker not stopping) the same
        transaction leases the next job for the slot this one frees, so a busy
        queue costs one commit per job instead of two. The lease comes after the
        compare-and-set ack: a rejected ack rolls the refill back with it, and a
        refill is only held (heartbeated, queued) once the transaction committed.
        If a try committed but its reply was lost (``_settle`` then finds the ack
        in the trace), that try's refill is not known here: it stays ``running``
        and is reaped after its lease, like any claim whose commit reply was lost.
        """
        leased: list[Job] = []
        leased_at = 0.0

        def write(tx: Transaction) -> None:
            nonlocal leased, leased_at
            leased = []  # a retried write starts over; only the committed try's jobs count
            now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
            ctx.flush(tx)
            assert job.owner_token is not None
            if not tx.job_transition(JobComplete(job.id, job.owner_token, now, result_json, hlc)):
                raise LeaseLostError("job.succeeded")
            self.runtime.hlc.observe(hlc)
            succeeded = trace.lifecycle(
                trace.JOB_SUCCEEDED,
                job,
                now=now,
                hlc=hlc,
                worker_id=self.worker_id,
                owner_token=job.owner_token,
                status="succeeded",
                duration=duration,
                version=handler.contract.version,
            )
            if refill and not self._stopping.is_set():
                leased, leased_at = self._lease_in(tx, 1, also=[succeeded])
            else:
                tx.trace_append([succeeded])

        if self._settle(job, write, ctx):
            # Held first: were anything below to raise, the leased job still runs.
            self._hold(leased, leased_at)
            ctx.committed()
            self.stats.succeeded += 1
            log.info("job %s succeeded in %.3fs", job.id, duration)

    def _cancel_event(
        self, tx: Transaction, job: Job, now: float, hlc: int, reason: str
    ) -> TraceEvent:
        """``job.cancelled`` for a running job: the steps it committed, the effects it claimed."""
        steps = [row.step_key for row in tx.step_by_job(job.id)]
        effects = [
            {"key": row.key, "status": row.status}
            for row in tx.idem_list(IdemFilter(job_id=job.id))
        ]
        return trace.lifecycle(
            trace.JOB_CANCELLED,
            job,
            now=now,
            hlc=hlc,
            worker_id=self.worker_id,
            status="cancelled",
            owner_token=job.owner_token,
            reason=reason,
            committed_steps=steps,
            claimed_effects=effects,
        )

    def _cancelled(self, job: Job, ctx: Context, reason: str, duration: float) -> None:
        """End an attempt that was asked to stop: its steps stay committed, nothing else is."""
        ctx.discard_writes()

        def write(tx: Transaction) -> None:
            now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
            ctx.flush(tx, failed=True)
            assert job.owner_token is not None
            if not tx.job_transition(JobCancelRunning(job.id, job.owner_token, now, hlc)):
                raise LeaseLostError("job.cancelled")
            tx.trace_append([self._cancel_event(tx, job, now, hlc, reason)])

        if self._settle(job, write, ctx):
            ctx.committed()
            self.stats.cancelled += 1
            log.warning("job %s cancelled while running (%s)", job.id, reason)

    def _fail(
        self, job: Job, handler: Handler, ctx: Context, exc: Exception, duration: float
    ) -> None:
        failure_class = classify(exc, dict(handler.error_map))
        retry = handler.contract.retry
        retryable = retry.retries(failure_class)
        message = f"{type(exc).__name__}: {exc}"
        exhausted = job.attempt >= job.max_attempts
        cancelled = False

        def write(tx: Transaction) -> None:
            nonlocal cancelled
            now = self.runtime.clock.now()
            ctx.flush(tx, failed=True)
            assert job.owner_token is not None
            # Asked to stop before the heartbeat told us: a failure ends it, never a retry.
            cancelled = job.id in tx.job_cancel_requested(self.worker_id)
            if cancelled:
                hlc = self.runtime.hlc.tick()
                if not tx.job_transition(JobCancelRunning(job.id, job.owner_token, now, hlc)):
                    raise LeaseLostError("job.cancelled")
                event = self._cancel_event(tx, job, now, hlc, f"failed after the cancel: {message}")
                tx.trace_append([event])
                return
            events = [
                trace.lifecycle(
                    trace.JOB_FAILED,
                    job,
                    now=now,
                    hlc=self.runtime.hlc.tick(),
                    worker_id=self.worker_id,
                    owner_token=job.owner_token,
                    status="fail",
                    error_class=failure_class.value,
                    error=message,
                    duration=duration,
                    version=handler.contract.version,
                    traceback=traceback.format_exception_only(exc)[-1].strip(),
                )
            ]
            hlc = self.runtime.hlc.tick()
            if retryable and not exhausted:
                delay = retry.delay(job.attempt, self.runtime.rng)
                params = JobRetry(
                    job.id, job.owner_token, now, now + delay, failure_class, message, hlc
                )
                if not tx.job_transition(params):
                    raise LeaseLostError("retry.scheduled")
                events.append(
                    trace.lifecycle(
                        trace.RETRY_SCHEDULED,
                        job,
                        now=now,
                        hlc=hlc,
                        worker_id=self.worker_id,
                        owner_token=job.owner_token,
                        status="queued",
                        reason=failure_class.value,
                        delay=delay,
                        ceiling=retry.ceiling(job.attempt),
                        run_at=now + delay,
                        next_attempt=job.attempt + 1,
                    )
                )
            else:
                reason = DeadReason.ATTEMPTS_EXHAUSTED if retryable else DeadReason.NOT_RETRYABLE
                if isinstance(exc, EffectInDoubtError):
                    reason = DeadReason.EFFECT_IN_DOUBT
                events.append(self._bury_in(tx, job, reason, failure_class, message, now, hlc))
            tx.trace_append(events)

        if self._settle(job, write, ctx):
            ctx.committed()
            if cancelled:
                self.stats.cancelled += 1
            elif retryable and not exhausted:
                self.stats.retried += 1
                log.warning("job %s failed (%s), retrying: %s", job.id, failure_class, message)
            else:
                self.stats.dead += 1
                log.error("job %s failed (%s), dead: %s", job.id, failure_class, message)

    def _bury(
        self, job: Job, reason: DeadReason, failure_class: FailureClass | None, message: str
    ) -> None:
        def write(tx: Transaction) -> None:
            now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
            tx.trace_append([self._bury_in(tx, job, reason, failure_class, message, now, hlc)])

        if self._settle(job, write):
            self.stats.dead += 1
            log.error("job %s dead (%s): %s", job.id, reason.value, message)

    def _bury_in(
        self,
        tx: Transaction,
        job: Job,
        reason: DeadReason,
        failure_class: FailureClass | None,
        message: str,
        now: float,
        hlc: int,
    ) -> TraceEvent:
        """Move the job this worker holds to ``dead`` in ``tx``; returns its ``job.dead`` event."""
        assert job.owner_token is not None
        error_class = failure_class.value if failure_class else None
        if not tx.job_transition(
            JobBury(job.id, job.owner_token, now, reason, error_class, message, hlc)
        ):
            raise LeaseLostError("job.dead")
        return trace.lifecycle(
            trace.JOB_DEAD,
            job,
            now=now,
            hlc=hlc,
            worker_id=self.worker_id,
            owner_token=job.owner_token,
            status="dead",
            reason=reason.value,
            error_class=error_class,
            error=message,
        )

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self, executors: list[threading.Thread]) -> None:
        # From the signal, not from here: the dispatcher may have spent a moment ending an
        # outage wait, and the grace is what an operator's process supervisor counts.
        deadline = (self._stop_requested or time.monotonic()) + self.grace_period
        while self._free_slots() < self.concurrency and time.monotonic() < deadline:
            if self._force.is_set():
                break
            time.sleep(0.05)
        self._force.set()  # settles still retrying against a dead database give up now
        with self._inflight_lock:
            leftovers = list(self._inflight.values())
        for index, flight in enumerate(leftovers):
            try:
                self._release(flight.job)
            except StorageError as exc:
                log.warning(
                    "worker %s: could not release job %s (%s); it is reaped after its lease",
                    self.worker_id,
                    flight.job.id,
                    exc,
                )
                if isinstance(exc, DatabaseUnavailableError):
                    # The database is gone: don't wait on it once per job. The rest are
                    # reaped after their leases too.
                    rest = [f.job.id for f in leftovers[index + 1 :]]
                    if rest:
                        log.warning("worker %s: jobs %s not released", self.worker_id, rest)
                    break
        for _ in executors:
            self._work.put(_STOP)

    def _release(self, job: Job) -> None:
        now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
        assert job.owner_token is not None
        with self.runtime.storage.transaction() as tx:
            if tx.job_transition(LeaseRelease(job.id, job.owner_token, now, hlc)):
                tx.trace_append(
                    [
                        trace.lifecycle(
                            trace.LEASE_RELEASED,
                            job,
                            now=now,
                            hlc=hlc,
                            worker_id=self.worker_id,
                            status="queued",
                            reason="worker shut down before the job finished",
                        )
                    ]
                )
                self.stats.released += 1
