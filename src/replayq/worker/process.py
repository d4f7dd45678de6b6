"""The worker: lease, heartbeat, run, classify, retry or bury, ack after commit, reap.

One dispatcher thread leases jobs in batches (up to ``concurrency + prefetch`` held
leases: the jobs beyond the running ones wait leased in the worker) and hands them
to ``concurrency`` executor threads. Successes are acked in groups (``acks.py``):
on a busy queue an executor with nothing left to run commits the acks waiting in
memory and leases the slots they free in the same transaction (one commit per
batch). One heartbeat extends every lease held, in one statement. On stop, jobs
leased ahead and not started go back to the queue at once; a dispatcher that dies of
an error other than a ``StorageError`` stops the worker the same way (``run`` then
raises it). Every write about a job is a compare-and-set on (job id, owner token): a
worker that lost its lease cannot change the job's state. The dispatcher also runs the
scheduler of the app's periodic jobs (off with ``scheduler=False``, ``--no-scheduler``)
between its looks for work.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from replayq.errors import DatabaseUnavailableError, StorageError
from replayq.observe.hooks import ReleaseReason
from replayq.queue.catalog import register_contracts
from replayq.storage.protocol import Autocommit, Listener
from replayq.storage.reconnect import Backoff
from replayq.storage.reports import JobsScheduled
from replayq.worker.core import STOP, InFlight, WorkerStats
from replayq.worker.execute import Executing
from replayq.worker.reap import Reaping

log = logging.getLogger("replayq.worker")

# How long a run whose jobs all finished waits for each kind of its threads (executors;
# heartbeat and acks) to end: they end at once then, this only bounds a surprise.
_JOIN_SECONDS = 1.0


def _join(threads: list[threading.Thread]) -> None:
    until = time.monotonic() + _JOIN_SECONDS
    for thread in threads:
        thread.join(max(0.0, until - time.monotonic()))


class Worker(Executing, Reaping):
    """Runs jobs of an ``App``. ``run()`` blocks until stopped (or, with ``burst``, idle)."""

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop leasing; jobs leased ahead and not started are released at once, running
        ones get ``grace_period`` to finish, then are released."""
        if self._stopping.is_set():
            self._force.set()
        self._stop_leasing()

    def _stop_leasing(self) -> None:
        """The stop, less a second one's force: also how a run whose dispatcher died
        stops (``_run``), the grace counting from the first of the two."""
        if not self._stopping.is_set():
            self._stop_requested = time.monotonic()  # the grace period counts from here
        self._stopping.set()
        self._wake.set()
        self._beat_wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("worker %s: signal %s, shutting down", self.worker_id, signum)
        self.stop()

    def run(self) -> WorkerStats:
        """Lease and run jobs until stopped (or, burst, until none is due); returns what
        this run did, once its threads have ended.

        On the main thread SIGTERM and SIGINT stop it (``stop``) while it runs; the
        handlers that were there before are put back when it returns (a burst run in a
        script leaves Ctrl-C raising ``KeyboardInterrupt`` again)."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for caught in (signal.SIGTERM, signal.SIGINT):
                previous[caught] = signal.signal(caught, self._on_signal)
        try:
            return self._run()
        finally:
            for caught, handler in previous.items():
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(caught, handler)

    def _run(self) -> WorkerStats:
        """``run`` within its signal handlers."""
        if not self._register_contracts():
            return self.stats
        self._ended.clear()
        self._leasing_closed = False
        if not self._stopping.is_set():
            # The force an earlier burst run's end set (``_shutdown``) is not this run's: it
            # would end this run's grace at once (a job leased as the run ends given up
            # instead of run) and give up its settles at their first storage error.
            self._force.clear()
        executors = [
            threading.Thread(target=self._executor, name=f"replayq-exec-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        heartbeat = threading.Thread(target=self._heartbeat, name="replayq-heartbeat", daemon=True)
        acks = threading.Thread(target=self._acks_thread, name="replayq-acks", daemon=True)
        if self.observers.members:
            self.runtime.add_tap(self.observers.events)
        self._grouping = True
        for thread in [*executors, heartbeat, acks]:
            thread.start()
        # Optional storage capability: backends that push wake-ups (PostgreSQL LISTEN).
        storage = self.runtime.storage
        self.notifier = storage.listen(self._on_notify) if isinstance(storage, Listener) else None
        try:
            self._dispatch()
        except BaseException:
            # Not the database's (a bug, an app's clock or registry erring): the worker
            # stops as a stop does (its jobs held ahead given back unstarted at once, the
            # running ones the grace period), then ``run`` raises it.
            log.exception("worker %s: the dispatcher failed; stopping", self.worker_id)
            self._stop_leasing()
            raise
        finally:
            if self.notifier is not None:
                self.notifier.close()
            finished = self._shutdown(executors)
            # A burst run ends without a stop: its heartbeat thread ends with it (at once
            # when nothing is in flight; after the last executor otherwise).
            self._grouping = False
            self._ended.set()
            self._beat_wake.set()
            self._acks_wake.set()
            if finished:
                _join([heartbeat, acks])
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
        if queue_name is not None and self.queues is not None and queue_name not in self.queues:
            return
        # With every slot held the dispatcher would lease nothing: not woken (on SQLite each
        # of this worker's own group commits is such a change). A slot that frees is
        # leased by its executor, which wakes the dispatcher when it finds nothing.
        if self._free_slots() > 0:
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
                _, jobs = self._lease_free_slots()
            except StorageError as exc:
                # Killed session, restart, partition: retry until the database is back or we
                # are told to stop. A claim whose commit was lost is reaped after its lease.
                backoff.wait(exc, self._stopping)
                continue
            backoff.reset()
            if jobs:
                continue
            nothing_held = self._free_slots() == self.capacity
            # Backing off after a start error (``Executing._unstartable``), or passing
            # over the job given back after one (``Leasing._skips_taken``), it leased
            # nothing although jobs may be due: not the end of a burst run.
            paused = self._starts_paused_until - time.monotonic()
            ending = self.burst and nothing_held and paused <= 0 and not self._lease_skipped
            if ending and self._burst_done(now):
                return
            wait = self.poll_interval if paused <= 0 else min(self.poll_interval, paused)
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
            storage = self.runtime.storage
            # One statement: in autocommit where the backend has it (PostgreSQL: one round
            # trip, where BEGIN READ ONLY and COMMIT around it made three).
            reading = (
                storage.autocommit()
                if isinstance(storage, Autocommit)
                else storage.transaction(readonly=True)
            )
            with reading as tx:
                count, next_run_at = tx.report(JobsScheduled(now, self.queues))
        except StorageError:
            return False  # the next lease meets the outage and backs off
        if next_run_at is not None and next_run_at - now <= self.burst_wait:
            return False
        self.stats.scheduled_later, self.stats.next_run_at = count, next_run_at
        return True

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self, executors: list[threading.Thread]) -> bool:
        """Wind the run down within the grace; ``True`` if every job finished in it (the
        threads are then joined: the run returns with them ended; past the grace it
        returns at once, a handler still running in its executor)."""
        # From the signal, not from here: the dispatcher may have spent a moment ending an
        # outage wait, and the grace is what an operator's process supervisor counts.
        deadline = (self._stop_requested or time.monotonic()) + self.grace_period
        # No lease after this one: an executor that freed its slot as the dispatcher decided
        # to end leases nothing later (it would hold jobs nobody runs until their lease
        # ran out). A lease already under way has held its jobs once the lock is ours.
        with self._lease_lock:
            self._leasing_closed = True
        # Jobs leased ahead and not started go back at once: another worker runs them now,
        # not after this one's grace (an executor that frees its slot starts none of them).
        self._release_unstarted()
        while not self._idle() and time.monotonic() < deadline:
            if self._force.is_set():
                break
            time.sleep(0.05)
            self._release_unstarted()
        finished = self._idle()
        self._force.set()  # settles still retrying against a dead database give up now
        # Acks still in memory: one last try, given up at once if the database is away.
        acks = self._take_acks(all_of_them=True)
        if acks:
            self._commit_group(acks, refill=False)
        # What is left past the grace: the jobs still running are released as started (an
        # attempt counted); a job held and not started (leased as a burst run ended, its
        # executor busy or not yet at it) goes back unstarted, marked ``releasing`` under the
        # lock ``_start`` reads it under, so no executor starts it after this look.
        with self._inflight_lock:
            leftovers = [f for f in self._inflight.values() if not (f.releasing or f.acking)]
            for flight in leftovers:
                if not flight.running:
                    flight.releasing = True
        self._give_back(
            [f for f in leftovers if not f.running], "worker ended before the job started"
        )
        self._release_all(
            [f.job for f in leftovers if f.running], "worker shut down before the job finished"
        )
        self._hand_out([STOP] * len(executors), everyone=True)
        if finished:
            # The run returns with its executors gone: a caller running burst after burst
            # keeps no threads of earlier runs.
            _join(executors)
        return finished

    def _release_unstarted(self) -> None:
        """Give back at once the jobs held but not started (only while stopping: a burst
        run that ends runs in its grace a job leased as it ended)."""
        if not self._stopping.is_set():
            return
        with self._inflight_lock:
            unstarted = [f for f in self._inflight.values() if not (f.running or f.releasing)]
            for flight in unstarted:
                flight.releasing = True
        self._give_back(unstarted, "worker stopped before the job started")

    def _give_back(self, unstarted: list[InFlight], reason: str) -> None:
        """Give back held jobs not started, each marked ``releasing`` by the caller: to the
        queue as if never leased (``lease.released``, ``started: false``, no attempt
        counted), the observers told."""
        if not unstarted:
            return
        self._give_back_unstarted(unstarted, reason)
        # Leased (``job_seen``) and never run: given back (or, the database away, left
        # to be reaped); one whose lease the heartbeat found lost meanwhile was dropped.
        lost = [f.job for f in unstarted if f.lost.is_set()]
        if lost:
            self.observers.released_all(lost, ReleaseReason.LOST)
        self.observers.released_all(
            [f.job for f in unstarted if not f.lost.is_set()], ReleaseReason.STOPPED
        )
