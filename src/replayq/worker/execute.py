"""The executor threads: each runs one leased job at a time through its handler.

A held job is started only while its lease is surely held (``InFlight.held_until``): a
worker that stalled while jobs waited in it renews their leases first and drops unrun
the jobs another worker took meanwhile (``_start``); a job whose start raised is given
back to the queue unstarted (``_unstartable``).

An attempt builds the job's ``Context`` over a ``LiveWorld``, runs the handler
(an ``async def`` one on the thread's own event loop) and hands the result to one
of the outcomes; on a busy queue a success leases the slot's next job in its ack.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any, ClassVar

from replayq import codec
from replayq.errors import (
    FailureClass,
    JobCancelledError,
    LeaseLostError,
    PayloadError,
    database_fault,
)
from replayq.model import DeadReason, Job
from replayq.observe.hooks import ReleaseReason
from replayq.queue.handlers import Handler
from replayq.recording.context import Context
from replayq.recording.ledger import ledger_loader
from replayq.recording.world import LiveWorld
from replayq.storage.reconnect import Backoff
from replayq.worker.acks import Acking
from replayq.worker.core import STOP
from replayq.worker.heartbeat import Heartbeat

log = logging.getLogger("replayq.worker")

# How many jobs' start errors a worker counts at most (``Executing._parks_unstartable``).
_START_ERRORS_KEPT = 1024


class Executing(Acking, Heartbeat):
    """Run leased jobs to a settled state."""

    # After a start error the worker leases nothing for a backoff's delay, from this many
    # seconds, doubled (jittered) at each start error in a row up to the cap; a start that
    # succeeds resets it (``_unstartable``).
    start_backoff_first: ClassVar[float] = 0.5
    start_backoff_cap: ClassVar[float] = 60.0
    # A job whose start raised on this many of its leases here in a row, while this worker
    # started other jobs meanwhile, is parked in ``dead`` (``start_failed``).
    start_errors_to_park: ClassVar[int] = 5

    def _executor(self) -> None:
        item = self._next_queued()
        while item is not STOP:
            # A job not started stays held: the stopping worker gives it back (``_shutdown``).
            started = False
            try:
                began = time.monotonic()
                started = self._start_or_give_back(item, began)
                if started:
                    self._execute(item)
                    self._ran_for(time.monotonic() - began)
            except Exception:
                log.exception("worker %s: job %s could not be settled", self.worker_id, item.id)
            except BaseException as exc:
                # ``KeyboardInterrupt``, ``SystemExit`` raised by the handler or a
                # ``ctx.db_write`` function in this thread (never a signal: those reach the
                # main thread), its attempt failed with it already (``_attempt``,
                # ``_succeed``): not this executor's end, nor the worker's.
                log.warning(
                    "worker %s: job %s raised %s; its attempt failed with it, the executor goes on",
                    self.worker_id,
                    item.id,
                    type(exc).__name__,
                )
            finally:
                if started:
                    self._ran(item)
            item = self._next_work()

    def _start_or_give_back(self, job: Job, now: float) -> bool:
        """``_start``; if it raises (a bug, an app's clock erring: not a refusal it
        decided), the job leaves the worker unstarted (``_unstartable``) and ``False``."""
        try:
            started = self._start(job, now)
        except Exception as exc:
            self._unstartable(job, exc)
            return False
        if started:
            self._starts += 1
            if self._start_errors or self._start_backoff is not None:
                self._started_after_errors(job)
        return started

    def _started_after_errors(self, job: Job) -> None:
        """A start succeeded after start errors: the job's own count of them is over, and
        so is the worker's backoff (the fault, if it was the worker's, has passed)."""
        self._start_errors.pop(job.id, None)
        backoff = self._start_backoff
        if backoff is not None:
            self._start_backoff = None
            self._starts_paused_until = 0.0
            log.info(
                "worker %s: a job started again after %d start errors in a row; leasing as usual",
                self.worker_id,
                backoff.failures,
            )

    def _unstartable(self, job: Job, exc: Exception) -> None:
        """A held job whose start raised: given back to the queue unstarted (attempt and
        budget as before, ``lease.released`` with ``started: false`` naming the error),
        forgotten, the observers told (``ReleaseReason.ERROR``), the error logged with its
        traceback. Never left held: its lease would be extended by every beat while it
        ran nowhere. Unstarted, it is not the job's failure: no attempt is counted (the
        next lease, this worker's or another's, starts it). If the database refuses the
        release, it stays ``running`` and is reaped after its lease.

        A start error is taken for the worker's (a bug, the app's lease clock erring):
        this worker then leases nothing for a backoff's delay (``start_backoff_first``
        doubled at each start error in a row, up to ``start_backoff_cap``; reset by a start
        that succeeds), so that a fault that raises at every start does not lease and give
        back the same jobs in a hot loop; other workers take them meanwhile. No job is
        buried for a fault of the worker's: a job is parked in ``dead`` (``start_failed``,
        the message naming the error) only once its start raised on
        ``start_errors_to_park`` of its leases here in a row while this worker started
        other jobs meanwhile: the fault follows that job. So that it does even on a worker
        of one slot, which the job, given back first in the queue, would otherwise fill at
        each lease, the worker's next lease passes over it once (``Leasing._skips_taken``):
        another job, if the queue has one, starts in between. The row ends once the job
        is started, here or elsewhere (its attempt at a later lease tells)."""
        self._back_off_starts(exc)
        if self._parks_unstartable(job, exc):
            return
        with self._inflight_lock:
            flight = self._flight_of(job)
            # Dropped already (its lease lost), taken up, or being given back by the stop.
            ours = flight is not None and not (flight.running or flight.releasing)
            if flight is not None and ours:
                flight.releasing = True
        log.error(
            "worker %s: job %s could not be started (%s); not started%s",
            self.worker_id,
            job.id,
            type(exc).__name__,
            ", given back to the queue" if ours else "",
            exc_info=exc,
        )
        if flight is None or not ours:
            return
        try:
            self._give_back_unstarted(
                [flight], f"the worker could not start the job ({type(exc).__name__})"
            )
        except Exception:
            log.exception("worker %s: job %s could not be given back", self.worker_id, job.id)
        with self._inflight_lock:
            self._skip_once.add(job.id)  # the next lease tries another job first
        lost = flight.lost.is_set()
        self.observers.released(job, ReleaseReason.LOST if lost else ReleaseReason.ERROR)

    def _back_off_starts(self, exc: Exception) -> None:
        """No lease by this worker for the start backoff's next delay."""
        backoff = self._start_backoff
        if backoff is None:
            backoff = self._start_backoff = Backoff(
                f"worker {self.worker_id}: start",
                first=self.start_backoff_first,
                cap=self.start_backoff_cap,
                fault="a job could not be started; leasing paused",
            )
        self._starts_paused_until = time.monotonic() + backoff.next_delay(exc)

    def _parks_unstartable(self, job: Job, exc: Exception) -> bool:
        """Count a start error of ``job``; at ``start_errors_to_park`` in a row with other
        jobs started meanwhile, park it (``start_failed``), forget it and ``True``."""
        errors, starts_then, attempt = self._start_errors.get(
            job.id, (0, self._starts, job.attempt)
        )
        if attempt != job.attempt:
            # Started somewhere since its last start error here (an unstarted give-back
            # takes its attempt back: a lease of it that raised again has the same one):
            # the errors before that run are not in a row with this one.
            errors, starts_then = 0, self._starts
        errors += 1
        if errors < self.start_errors_to_park or self._starts == starts_then:
            if len(self._start_errors) >= _START_ERRORS_KEPT and job.id not in self._start_errors:
                self._start_errors.clear()  # bounded: a count lost only delays a park
            self._start_errors[job.id] = (errors, starts_then, job.attempt)
            return False
        with self._inflight_lock:
            flight = self._flight_of(job)
            ours = flight is not None and not (flight.running or flight.releasing)
            if flight is not None and ours:
                flight.releasing = True
        if flight is None or not ours:
            return False
        self._start_errors.pop(job.id, None)
        error = self.runtime.redactor_for(job.job_type).error(exc)
        message = (
            f"the worker could not start the job on {errors} of its leases in a row, while "
            f"it started other jobs: {error}"
        )
        log.error(
            "worker %s: job %s could not be started (%s); parked",
            self.worker_id,
            job.id,
            type(exc).__name__,
            exc_info=exc,
        )
        try:
            self._bury(job, DeadReason.START_FAILED, None, message)
        except Exception:
            log.exception("worker %s: job %s could not be parked", self.worker_id, job.id)
        finally:
            self._forget_all([job])
        self.observers.released(job, ReleaseReason.ERROR)
        return True

    def _start(self, job: Job, now: float) -> bool:
        """Mark a held job started; ``False`` if the worker is stopping and gives it back
        unstarted (or already has), or if its lease is lost: the job is dropped unrun.

        ``now``: ``time.monotonic()``. A job is started only while its lease is surely
        held (``InFlight.held_until``, one comparison): past that, the worker stalled
        while the job waited (it was leased ahead, or the executor was stopped) and
        another worker may have reaped it and run it. Its lease is then renewed first
        (``_renew_before_start``) and the job started only if it is still held; a lease
        the heartbeat already found lost fails the same comparison. Never an ack or a
        write for a dropped job: the trace has the heartbeat's ``lease.lost``
        (``started: false``), the job is the new holder's. The observers are told it left
        unrun (``Observer.released``).
        """
        if not self._leases_monotonic:
            now = self._lease_clock()  # the app's clock judges leases (a test's)
        with self._inflight_lock:
            flight = self._flight_of(job)
            # Running already: ``execute()`` took it up (the inline path).
            if flight is None or flight.running or flight.releasing or self._stopping.is_set():
                return False
            if now < flight.held_until:
                flight.running = True
                return True
        renewed = self._renew_before_start(flight)
        with self._inflight_lock:
            if flight.releasing or self._stopping.is_set():
                return False  # the stopping worker gives it back (or finds it lost)
            # Read under the lock the heartbeat marks a lease lost under: exact.
            if renewed and not flight.lost.is_set():
                flight.running = True
                return True
            dropped = self._flight_of(job) is flight
            if dropped:
                del self._inflight[job.id]
        self.stats.lost += 1
        if dropped:
            # Leased (``job_seen``) and never run: the observers hear it left (no ``settled``).
            lost = flight.lost.is_set()
            self.observers.released(job, ReleaseReason.LOST if lost else ReleaseReason.NOT_RENEWED)
        log.warning(
            "worker %s: job %s waited here past its lease (the worker stalled?) and %s; "
            "not started",
            self.worker_id,
            job.id,
            "another worker took it"
            if flight.lost.is_set()
            else "it was asked to stop (not renewed; the reaper cancels it)"
            if flight.cancel.is_set()
            else "it could not be renewed",
        )
        return False

    def _next_work(self) -> Any:
        """The next job for an executor that just freed its slot.

        With work queued locally (leased ahead), that: the acks of the jobs before
        it wait in memory (``acks.py``). Else the executor commits the waiting acks
        and leases for the free slots in the same transaction, so a busy queue costs
        one commit per batch and no thread hand-off (on a 2-vCPU VM each wake-up of
        the dispatcher cost ~0.3 ms, more than the job's SQL). Only when nothing was
        leased is the dispatcher woken (to poll, reap, or end a burst run).

        One executor refills at a time. One that finds another refilling waits for
        that refill and takes a job it brought, its own ack left for the next group:
        before, it waited for the lease lock and then committed a group of its own ack
        alone, leasing its one slot (with four executors, most groups were of one).
        """
        job = self._queued()
        if job is not None:
            return job
        leased: list[Job] = []
        with self._refilling:
            job = self._queued()  # a refill this executor waited for brought jobs
            if job is not None:
                return job
            try:
                acks = self._take_acks()
                if acks:
                    leased = self._commit_group(acks, refill=True)
                elif not self._stopping.is_set():
                    _, leased = self._lease_free_slots()
            except Exception:
                # Never let an executor thread die: the dispatcher leases (with backoff).
                log.exception("worker %s: lease from an executor failed", self.worker_id)
        if not leased:
            self._wake.set()
        return self._next_queued()

    def _queued(self) -> Any:
        """A job (or ``STOP``) queued for the executors, else None; the acks waiting
        commit when their window ends, unless a refill takes them first."""
        try:
            job = self._work.get_nowait()
        except queue.Empty:
            return None
        self._taken += 1
        self._arm_acks()
        return job

    def execute(self, job: Job) -> None:
        """Run one leased job to a settled state (succeeded, retry scheduled, or dead).

        The inline path (``lease()`` then ``execute(job)``; ``replayq.testing.run_inline``):
        the worker then forgets the job as it does after an executor's attempt (its slot
        free, its lease no longer beaten nor given back at a stop), and outside ``run()``
        takes it off the executors' queue its lease put it on, so a loop of inline jobs
        keeps nothing of them and a later ``run()`` does not start them again."""
        with self._inflight_lock:
            flight = self._flight_of(job)
            if flight is not None:
                flight.running = True  # taken up: an executor does not start it too
        try:
            self._execute(job)
        finally:
            self._ran(job)
            if not self._grouping:
                self._unqueue_unheld()

    def _unqueue_unheld(self) -> None:
        """Take off the executors' queue the jobs no longer held (run inline, outside
        ``run()``: nothing else takes them), the others left in their order."""
        work = self._work
        kept = []
        while not work.empty():  # no ``queue.Empty`` raised once it is (one per inline job)
            try:
                item = work.get_nowait()
            except queue.Empty:  # another thread took it (``execute`` from several threads)
                break
            with self._inflight_lock:
                held = item is STOP or self._flight_of(item) is not None
            if held:
                kept.append(item)
        for item in kept:
            work.put(item)

    def _execute(self, job: Job) -> None:
        self._deferred.job_id = None
        ctx = None
        try:
            with self.observers.attempt(job, self.worker_id):
                ctx = self._attempt(job)
        finally:
            # A success whose ack waits for its group commit is settled (and its context
            # released) by that commit; the context ended when the handler returned.
            if self._deferred.job_id != job.id:
                self.observers.settled(job)
                if ctx is None:
                    # ``_attempt`` raised (its settle failed: the job stays running and is
                    # reaped): the context it had built is its flight's.
                    flight = self._flight_of(job)
                    ctx = flight.ctx if flight is not None else None
                if ctx is not None:
                    ctx.release()

    def _attempt(self, job: Job) -> Context | None:
        """Run one attempt of ``job`` and settle it (or buffer its ack); the context it ran
        in (``None``: the job was buried before it ran)."""
        flight = self._flight_of(job)
        # Looked up once per lease, when it was held (``Leasing._hold``), for this very job.
        handler = flight.handler if flight is not None and flight.job is job else None
        if handler is None:
            handler = self._handler_or_none(job)
        if handler is None:
            self._bury(
                job,
                DeadReason.UNKNOWN_JOB_TYPE,
                None,
                f"no handler for job type {job.job_type!r} on worker {self.worker_id}",
            )
            return None
        try:
            # What ``ctx.run`` calls with; a refusal quotes no secret (its burial's text).
            args = handler.decode_payload(job.payload, self.runtime.redactor_of(handler))
        except PayloadError as exc:
            self._bury(job, DeadReason.MALFORMED_PAYLOAD, FailureClass.VALIDATION, str(exc))
            return None
        # Only a later attempt can find steps an earlier one committed.
        steps = ledger_loader(self.runtime, job.id) if job.attempt > 1 else None
        world = LiveWorld(flight.lost if flight is not None else None, steps)
        learning = self._pack_learning()
        if learning is not None:  # its new packs: its type's learned dictionary
            learning.attempt_starts(job.id, job.job_type)
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
            result = ctx.run(self.event_loop.run if handler.is_async else None, args)
            # ``None`` (most handlers return nothing) is ``null`` without the encoder's checks.
            result_json = (
                "null" if result is None else codec.dumps(result, what=f"{job.job_type} result")
            )
        except LeaseLostError as exc:
            # A commit or effect claim was fenced, or a cancel point found the lease the
            # heartbeat marked lost: another worker holds the job now. The attempt ends
            # here, no retry of this worker's; only its events (with ``write.fenced``) are kept.
            self._reject(job, exc, ctx)
            return ctx
        except JobCancelledError as exc:
            self._cancelled(job, ctx, str(exc), time.monotonic() - started)
            return ctx
        except Exception as exc:
            fault = database_fault(exc)
            if fault is not None:
                self._put_back(job, handler, ctx, exc, fault, time.monotonic() - started)
                return ctx
            ctx.discard_writes()
            self._fail(job, handler, ctx, exc, time.monotonic() - started)
            self._compare(job, handler)
            return ctx
        except BaseException as exc:
            # ``KeyboardInterrupt``, ``SystemExit`` (the handler's, or a ``ctx.db_write``
            # function's at a step's commit): the attempt fails with it, classified as any
            # error, and then it goes on to the caller — ``execute()``'s (a Ctrl-C still
            # stops a script running jobs inline), an executor's, which goes on.
            ctx.discard_writes()
            self._fail(job, handler, ctx, exc, time.monotonic() - started)
            raise
        # ``ctx.cancelled`` reads True from the handler's return on (the context ended):
        # the heartbeat's flag itself says whether the attempt was stopped.
        if ctx.cancel_requested:
            if ctx.lease_lost:
                # The heartbeat found the lease lost (the cancel flag says so too): its ack
                # would be refused; recorded as that refusal without asking the database.
                self._reject(job, LeaseLostError("job.succeeded"), ctx)
                return ctx
            if ctx.stopped_before_return:
                # The handler could have seen ``ctx.cancelled`` and returned early: the
                # attempt ends cancelled, and what it did outside a step is not committed.
                self._cancelled(job, ctx, "the handler returned after the cancel", 0.0)
                return ctx
            # The cancel reached the worker after the handler returned: the handler had
            # completed (its effects ran), so its result stands and the ack goes on; the
            # cancel arrived too late (``job.succeeded`` says so, ``_acks_written``).
            log.warning(
                "job %s: asked to stop after its handler returned; too late, the completed "
                "attempt is acked",
                job.id,
            )
        self._succeed(job, handler, ctx, result_json, time.monotonic() - started)
        self._compare(job, handler)
        return ctx

    def _compare(self, job: Job, handler: Handler) -> None:
        """Shadow and dual-run: the candidate re-runs this settled attempt, sealed.

        Only the authoritative run made real effects; the candidate gets its recorded
        answers (observe-only) and the comparison is stored for ``rollout status``.
        """
        for mode, version in self.router.comparisons_for(job, handler.contract.version):
            # Imported here: the replay engine is a worker's only once a type has a shadow.
            from replayq.rollout.shadow import compare_attempt

            try:
                compare_attempt(self.runtime, job, version, mode=mode)
            except Exception:  # a comparison never fails the job it observes
                log.exception("job %s: %s run of %s failed", job.id, mode, version)
