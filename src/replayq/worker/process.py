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

import logging
import signal
import threading
import time
from types import FrameType

from replayq.errors import DatabaseUnavailableError, StorageError
from replayq.model import Job
from replayq.queue.catalog import register_contracts
from replayq.storage.protocol import Listener
from replayq.storage.reconnect import Backoff
from replayq.storage.reports import JobsScheduled
from replayq.worker.core import STOP, WorkerStats
from replayq.worker.execute import Executing
from replayq.worker.heartbeat import Heartbeat
from replayq.worker.reap import Reaping

log = logging.getLogger("replayq.worker")


class Worker(Executing, Reaping, Heartbeat):
    """Runs jobs of an ``App``. ``run()`` blocks until stopped (or, with ``burst``, idle)."""

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop leasing; in-flight jobs get ``grace_period`` to finish, then are released."""
        if self._stopping.is_set():
            self._force.set()
        else:
            self._stop_requested = time.monotonic()  # the grace period counts from here
        self._stopping.set()
        self._wake.set()
        self._beat_wake.set()

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
        self._ended.clear()
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
            # A burst run ends without a stop: its heartbeat thread ends with it (at once
            # when nothing is in flight; after the last executor otherwise).
            self._ended.set()
            self._beat_wake.set()
            self.event_loop.close()
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
                count, next_run_at = tx.report(JobsScheduled(now, self.queues))
        except StorageError:
            return False  # the next lease meets the outage and backs off
        if next_run_at is not None and next_run_at - now <= self.burst_wait:
            return False
        self.stats.scheduled_later, self.stats.next_run_at = count, next_run_at
        return True

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
            self._work.put(STOP)

    def _release(self, job: Job) -> None:
        with self.runtime.storage.transaction() as tx:
            if self._release_in(tx, job, "worker shut down before the job finished"):
                self.stats.released += 1
