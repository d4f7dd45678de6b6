"""Leasing: the jobs for the free slots, their ``job.leased`` events, their routed version.

A lease is held (tracked for heartbeats, queued for an executor) only once its
transaction committed: a rolled-back lease holds nothing.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from msgspec import structs

from replayq.model import Job, TraceEvent
from replayq.queue import lifecycle as trace
from replayq.storage.protocol import JobLease, JobRoute, LeasesExtend, Transaction
from replayq.worker.core import InFlight, WorkerCore


class Leasing(WorkerCore):
    """Lease up to the free slots and hand the jobs to the executors."""

    def _lease_free_slots(self) -> tuple[int, list[Job]]:
        """Lease up to the number of free slots; returns (free slots before, jobs leased)."""
        if self._free_slots() <= 0:
            return 0, []  # nothing to lease: the lock is left to the executors' group commits
        with self._lease_lock:
            free, ahead = self._slots()
            return free, (self.lease(free, ahead) if free > 0 else [])

    def _slots(self, acking: int = 0) -> tuple[int, int]:
        """(slots to lease, how many of them lie beyond the free executors: leased ahead);
        ``acking``: held leases whose acks the caller's transaction commits. None once
        leasing is closed (called under ``_lease_lock``, as the close is), nor while the
        worker backs off after a start error."""
        if self._leasing_closed:
            return 0, 0
        if self._starts_paused_until and time.monotonic() < self._starts_paused_until:
            return 0, 0  # a start raised: this worker backs off (``Executing._unstartable``)
        with self._inflight_lock:
            held = len(self._inflight) - acking
        executors = max(0, self.concurrency - held)
        ahead = min(max(0, self.capacity - held - executors), self._ahead_allowed())
        return executors + ahead, ahead

    def _ahead_allowed(self) -> int:
        """How many jobs may wait leased: as many as the executors finish within
        ``prefetch_window`` at the recent pace, at most ``prefetch``; none before the
        pace is known (a first job may be long)."""
        if self.prefetch == 0 or math.isinf(self.prefetch_window):
            return self.prefetch
        seconds = self._job_seconds
        if seconds is None:
            return 0
        pace = self.prefetch_window * self.concurrency / max(seconds, 1e-6)
        return min(self.prefetch, int(pace))

    def _ran_for(self, seconds: float) -> None:
        """Count one attempt's seconds into the recent pace (a moving average)."""
        mean = self._job_seconds
        self._job_seconds = seconds if mean is None else 0.8 * mean + 0.2 * seconds

    def _lease_params(self, limit: int, *, collision_aborts: bool = False) -> JobLease:
        registry = self.runtime.registry
        handlers = {
            t: registry.handler(t) for t in (*registry.job_types(), *registry.system_types())
        }
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
            skip_ids=self._skips_taken() if limit > 0 else None,
            database_clock=self.runtime.leases_by_database,
            collision_aborts=collision_aborts,
        )

    def _skips_taken(self) -> list[int] | None:
        """The jobs this lease passes over, once: each was given back after its start
        raised here (``Executing._unstartable``) and, first in the queue again, would be
        all a worker of one slot leased, never starting another job in between: the
        worker could never tell a fault of the job's (parked, ``start_failed``) from one
        of its own (never parked). Passed over once, not until another job starts: a
        queue that has no other job leases it again at the next poll (``_lease_skipped``:
        a lease that passed over jobs and leased none does not end a burst run)."""
        if not self._skip_once:
            self._lease_skipped = False
            return None
        with self._inflight_lock:
            skipped, self._skip_once = self._skip_once, set()
        self._lease_skipped = True
        return sorted(skipped)

    def lease(self, limit: int, ahead: int = 0) -> list[Job]:
        """Lease up to ``limit`` jobs and queue them for the executors; the last ``ahead``
        of them wait for an executor (leased ahead)."""
        held_at = time.monotonic()  # before the claim is sent: ``InFlight.held_until``
        with self.runtime.storage.transaction() as tx:
            jobs, now = self._lease_in(tx, limit, ahead)
        self._hold(jobs, now, held_at)
        return jobs

    def _fixed_window_types(self) -> set[str]:
        """Job types whose lease is a fixed visibility timeout (heartbeat 0): the active
        version's, or for a routed type any version a job may be routed to, which holds
        its own version's lease (``_routed``)."""
        registry = self.runtime.registry
        routed = self.router.routed_types()
        return {
            t
            for t in registry.job_types()
            if any(
                registry.handler(t, version).contract.heartbeat <= 0
                for version in (registry.versions(t) if t in routed else (None,))
            )
        }

    def _claim(self, tx: Transaction, params: JobLease, ahead: int) -> list[Job]:
        """``job_lease`` for ``params.limit`` jobs, of which the last ``ahead`` wait leased
        in this worker. A fixed visibility timeout counts from the lease, so a job that
        has one is never leased ahead: those slots take the other types only."""
        fixed = self._fixed_window_types() if ahead > 0 else set()
        if not fixed:
            return tx.job_lease(params)
        registry = self.runtime.registry
        others = [t for t in (*registry.job_types(), *registry.system_types()) if t not in fixed]
        first = params.limit - ahead
        if first <= 0:
            # No free executor: jobs of the fixed types, due maybe, were not looked for. A
            # lease that finds nothing then does not tell a burst run the queue is empty
            # (the slot may have freed just after: ``_lease_skipped``, read by ``_dispatch``).
            self._lease_skipped = True
        now = tx.job_lease(structs.replace(params, limit=first)) if first > 0 else []
        if not others or len(now) < first:  # the queue has no more ready jobs
            return now
        return now + tx.job_lease(structs.replace(params, limit=ahead, job_types=others))

    def _lease_in(
        self,
        tx: Transaction,
        limit: int,
        ahead: int = 0,
        also: Sequence[TraceEvent] = (),
        *,
        collision_aborts: bool = False,
    ) -> tuple[list[Job], float]:
        """Lease up to ``limit`` jobs inside ``tx`` with their ``job.leased`` events; the
        last ``ahead`` of them are leased ahead of a free executor.

        ``also``: events of the same transaction appended before those (one insert
        batch). Returns (jobs, lease time). The caller hands them to ``_hold`` once
        ``tx`` has committed, never before: a rolled-back lease holds nothing.
        ``collision_aborts``: the caller does ``tx`` again if the claim collides on an
        ordering key (``LeaseCollisionError``; ``JobLease.collision_aborts``).
        """
        self.router.refresh(tx)
        params = self._lease_params(limit, collision_aborts=collision_aborts)
        claimed = self._claim(tx, params, ahead) if limit > 0 else []
        router = self.router
        if any(
            job.handler_version is not None and router.is_routed(job.job_type) for job in claimed
        ):
            # A routed job that ran before (a retry, a redelivery) keeps its version only
            # while the routing names it: read now, not up to half a second ago, so that an
            # attempt running at a rollback and failing right after it retries on the
            # baseline (a routing read per such batch; new jobs keep the cached one).
            router.refresh(tx, force=True)
        routed = [self._routed(tx, job, params) for job in claimed]
        jobs = [job for job, _ in routed]
        events = list(also)
        hlc = self.runtime.hlc
        for job, moved_from in routed:
            hlc.observe(job.hlc)
            # A job whose routing no longer names its version (rolled back): the trace says so.
            moved: dict[str, Any] = {"version_moved_from": moved_from} if moved_from else {}
            events.append(
                trace.lifecycle(
                    trace.JOB_LEASED,
                    job,
                    now=params.now,
                    # Stamped at the event's own time: one clock read per batch, not per job.
                    hlc=hlc.tick_at(params.now),
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

    def _routed(self, tx: Transaction, job: Job, params: JobLease) -> tuple[Job, str | None]:
        """The leased job with its version (kept from its first lease, else chosen now),
        and the version it was moved from, if it had one its routing no longer names.

        A routed type's jobs are claimed with the active version's lease; one that runs
        another version holds that version's lease instead, set here in the lease's
        transaction: a candidate declared with a longer fixed window (heartbeat 0) is not
        redelivered while it runs, and one with a shorter lease is reaped as soon as its
        contract says."""
        version = self.router.choose(job)
        moved_from = None
        if version is not None and tx.job_transition(JobRoute(job.id, params.owner_token, version)):
            moved_from = job.handler_version
            job = job.evolve(handler_version=version)
        if job.handler_version is None or not self.router.is_routed(job.job_type):
            return job, moved_from
        handler = self._handler_or_none(job)
        lease = handler.contract.lease if handler is not None else None
        if lease is None or lease == params.lease_for.get(job.job_type):
            return job, moved_from
        change = LeasesExtend(
            ((job.id, params.owner_token, lease),), params.now, params.database_clock
        )
        if job.id in tx.lease_extend(change):
            granted = job.leased_at if job.leased_at is not None else params.now
            job = job.evolve(lease_deadline=granted + lease)
        return job, moved_from

    def _hold(self, jobs: Sequence[Job], now: float, held_at: float) -> None:
        """Jobs whose lease committed: track them for heartbeats and queue them to run.

        ``held_at``: ``time.monotonic()`` read before the claim was sent (one reading for
        the batch, as its lease is one), so that a bound counted from it ends no later
        than the lease the database granted (``InFlight.held_until``).
        """
        if not jobs:
            return
        wake_heartbeat = False
        by_monotonic = self._leases_monotonic
        flights = []
        for job in jobs:
            # Both in the clock that granted the lease (the database's, or ``now``'s).
            granted = job.leased_at if job.leased_at is not None else now
            lease_seconds = (job.lease_deadline or granted) - granted
            held_until = (held_at if by_monotonic else granted) + lease_seconds
            handler = self._handler_or_none(job)
            beat = handler.contract.heartbeat if handler else lease_seconds / 3
            # heartbeat 0: a fixed visibility timeout, the lease is never extended.
            first_beat = held_at + beat if beat > 0 else math.inf
            flights.append(
                InFlight(job, lease_seconds, beat, first_beat, held_at, held_until, handler=handler)
            )
        with self._inflight_lock:  # once for the batch
            inflight = self._inflight
            for flight in flights:
                inflight[flight.job.id] = flight
                # The heartbeat sleeps until a beat is due: woken only if this one is sooner
                # (a wake-up per batch cost as much as a no-op job's SQL).
                wake_heartbeat = wake_heartbeat or flight.next_heartbeat < self._beat_wake_at
        self.observers.job_seen_all(jobs)
        self._hand_out(jobs)
        if wake_heartbeat:
            self._beat_wake.set()
        self.stats.leased += len(jobs)
