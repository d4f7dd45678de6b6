"""The heartbeat thread: extends the lease of every job in flight, and sees cancel requests.

A lease it finds lost stops the job's handler at its next cancel point (``LeaseLostError``),
as a cancel request does (``JobCancelledError``): the job is another worker's now.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from replayq.errors import DatabaseUnavailableError, ReplayqError, RowLockTimeoutError
from replayq.queue import lifecycle as trace
from replayq.storage.params import CancelRequested
from replayq.storage.protocol import LeasesExtend, Transaction
from replayq.storage.reconnect import Backoff
from replayq.worker.core import InFlight, WorkerCore

log = logging.getLogger("replayq.worker")

# The heartbeat thread's longest sleep with nothing due, and its shortest between beats.
IDLE_WAKE = 1.0
MIN_WAKE = 0.05


class Heartbeat(WorkerCore):
    """Keep this worker's leases alive; mark a lease lost when its compare-and-set fails."""

    def _heartbeat(self) -> None:
        """Beat when a lease needs it, and only then: the thread sleeps until the next
        flight's beat is due (at most ``IDLE_WAKE`` seconds; a new lease or the worker's
        end wakes it sooner), not on a fixed tick. One beat covers every lease held:
        once one is due, all of them are extended, in one statement."""
        backoff = Backoff(f"worker {self.worker_id}: heartbeat")
        while not ((self._stopping.is_set() or self._ended.is_set()) and self._idle()):
            held = self._renewable()
            now = time.monotonic()
            due = held if any(f.next_heartbeat <= now for f in held) else []
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
                except Exception:
                    # Not the database away (a bug, the app's clock failing): logged, and
                    # the beat tried again on the old tick. Ending the thread would let
                    # every lease this worker holds run out under its running handlers.
                    log.exception("worker %s: heartbeat failed", self.worker_id)
            with self._inflight_lock:
                upcoming = min((f.next_heartbeat for f in self._inflight.values()), default=None)
                now = time.monotonic()
                wait = IDLE_WAKE if upcoming is None else upcoming - now
                # At least MIN_WAKE: a beat that failed (or is skipped while its job settles)
                # is tried again on the old tick, never in a busy loop.
                wait = min(max(wait, MIN_WAKE), IDLE_WAKE)
                # Under the lock: a lease held after the look above sees this, and wakes the
                # thread only if its first beat is due sooner (``Leasing._hold``).
                self._beat_wake_at = now + wait
            self._beat_wake.wait(wait)
            self._beat_wake.clear()

    def _renewable(self) -> list[InFlight]:
        """The leases a beat extends: every one held but a fixed visibility timeout's
        (heartbeat 0), whose window counts from its lease and is never extended."""
        with self._inflight_lock:
            held = [f for f in self._inflight.values() if f.heartbeat_seconds > 0]
        return held

    def extend_leases(self, flights: Sequence[InFlight]) -> None:
        """Extend the given leases; a failed compare-and-set marks the lease lost.

        A job settling right now is skipped: its settle holds ``beat``, and a lease
        extended between the settle's clock tick and its commit would be traced
        after the job's end although it committed before it.
        """
        held = [flight for flight in flights if flight.beat.acquire(blocking=False)]
        try:
            if held:
                self._extend(held)
        finally:
            for flight in held:
                flight.beat.release()

    def _renew_before_start(self, flight: InFlight) -> bool:
        """Whether a held job whose lease may have run out while it waited (its
        ``held_until`` passed: the worker stalled, SIGSTOP, a paused VM, a long pause)
        is still this worker's to start.

        Its lease is renewed first, with every other lease held, in one statement (a
        heartbeat's): the database judges the lease, and until a reaper took the job the
        owner token still holds it. ``False``: the renew found it lost (``lease.lost``,
        ``started: false``), or could not ask (the database away), or did not extend it
        (the job was asked to stop: a beat extends no such lease), or its lease is a fixed
        visibility timeout (heartbeat 0: never renewed). The caller then drops the job
        unrun; a lease still held is reaped after its deadline, which is past (a job
        asked to stop is then cancelled).
        """
        if flight.heartbeat_seconds <= 0:
            return False
        held = self._renewable()
        # Blocking on this one: a beat of it under way (the heartbeat thread's, woken by
        # the same stall) answers the question; the others are skipped if busy, as a beat does.
        with flight.beat:
            if flight.lost.is_set() or self._lease_clock() < flight.held_until:
                return self._surely_held(flight)  # that beat answered
            others = [f for f in held if f is not flight and f.beat.acquire(blocking=False)]
            try:
                self._extend([flight, *others])
            except ReplayqError as exc:
                log.warning(
                    "worker %s: job %s waited past its lease and could not be renewed (%s); "
                    "not started, it is reaped",
                    self.worker_id,
                    flight.job.id,
                    exc,
                )
                return False
            finally:
                for other in others:
                    other.beat.release()
        return self._surely_held(flight)

    def _surely_held(self, flight: InFlight) -> bool:
        """Whether ``flight``'s lease is held now by its bound: not found lost, and
        extended (not only not lost: a beat leaves a job asked to stop unextended)."""
        return not flight.lost.is_set() and self._lease_clock() < flight.held_until

    def _extend(self, flights: Sequence[InFlight]) -> None:
        now = self.runtime.clock.now()
        # Before the extension is sent: ``held_until``. In the app's clock, the very ``now``
        # the new deadline is counted from (a second reading would end past it).
        sent_at = self._lease_clock() if self._leases_monotonic else now
        with self.runtime.storage.transaction() as tx:
            events = []
            asked_to_stop = {j.id for j in tx.job_list(CancelRequested(self.worker_id))}
            extending = []
            for flight in flights:
                if flight.lost.is_set():
                    # Lost for good (the owner token was this lease's): no beat, no second
                    # ``lease.lost``.
                    continue
                if flight.releasing or flight.ended:
                    # Given back unstarted, under this ``beat`` (read under it): released
                    # already, or once this beat ends (``Outcomes._give_back_unstarted``);
                    # or settled (``Settling._settle``, a group's ack): the lease is gone.
                    continue
                if flight.job.id in asked_to_stop and not flight.acking:
                    # Not extended: a handler that reaches no step boundary within the
                    # lease is cancelled by the reaper, its late writes fenced.
                    if not flight.cancel.is_set():
                        log.info("job %s: asked to stop; it stops at its next step", flight.job.id)
                    flight.cancel.set()
                    flight.next_heartbeat = time.monotonic() + flight.heartbeat_seconds
                else:
                    if flight.job.id in asked_to_stop:
                        # Its handler returned and its ack waits for the group commit: the
                        # request came too late (``cancel_too_late``), and the lease is
                        # still extended. Left to run out, the reaper cancelled the job
                        # and the ack of the completed attempt was refused.
                        flight.cancel.set()
                    extending.append(flight)
            held = _extend_held(tx, extending, now, self.runtime.leases_by_database)
            unstarted = self._mark_lost([f for f in extending if f.job.id not in held])
            for flight in extending:
                job = flight.job
                extended = job.id in held
                name = trace.LEASE_EXTENDED if extended else trace.LEASE_LOST
                # ``started: false``: a job held ahead, dropped unrun (``Executing._start``).
                data: dict[str, Any] = {"started": False} if job.id in unstarted else {}
                events.append(
                    trace.lifecycle(
                        name,
                        job,
                        now=now,
                        hlc=self.runtime.hlc.tick(),
                        worker_id=self.worker_id,
                        lease_deadline=now + flight.lease_seconds if extended else None,
                        **data,
                    )
                )
                flight.next_heartbeat = (
                    time.monotonic() + flight.heartbeat_seconds if extended else math.inf
                )
            tx.trace_append(events)
        # Once committed: an extension rolled back holds nothing longer.
        for flight in extending:
            if flight.job.id in held:
                flight.held_until = sent_at + flight.lease_seconds
        for flight in flights:
            if flight.ctx is not None and not flight.lost.is_set():
                try:
                    flight.ctx.renew_locks()
                except RowLockTimeoutError as exc:
                    # One job's lock row held by another transaction (PostgreSQL: a commit
                    # fenced under it, maybe of a worker frozen inside one) is that job's
                    # alone: the other jobs' locks are still renewed (an error ending the
                    # loop left them to run out under their handlers, beat after beat).
                    # Its renewal is tried again at the next beat.
                    log.warning("worker %s: job %s: %s", self.worker_id, flight.job.id, exc)

    def _mark_lost(self, flights: Sequence[InFlight]) -> set[int]:
        """Mark the flights' leases lost; the ids of those whose job had not started.

        Under ``_inflight_lock``, as ``Executing._start`` reads ``held_until`` and sets
        ``running``: a job not running now is never started, so the trace can say so.

        A running job's handler is stopped too: its context's cancel flag is set, so its
        next cancel point raises ``LeaseLostError`` (the context asks which of the two
        flags it was, only once one is set) and ``ctx.cancelled`` reads True. The lost
        flag first: a handler that sees the cancel flag must find the lease lost.
        """
        if not flights:
            return set()
        with self._inflight_lock:
            for flight in flights:
                flight.lost.set()
                flight.cancel.set()
                flight.held_until = -math.inf
            return {f.job.id for f in flights if not f.running}


def _extend_held(
    tx: Transaction, flights: Sequence[InFlight], now: float, database_clock: bool
) -> set[int]:
    """Extend the flights' leases, each by its own length, in one statement; the ids of
    those still held."""
    leases = []
    for flight in flights:
        assert flight.job.owner_token is not None
        leases.append((flight.job.id, flight.job.owner_token, flight.lease_seconds))
    return tx.lease_extend(LeasesExtend(tuple(leases), now, database_clock))
