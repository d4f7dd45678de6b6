"""Outcomes: how an attempt ends — cancelled, failed (retried or dead), buried (succeeded:
``acks.py``).

Each is one write given to ``Settling._settle``: the job's state change (a
compare-and-set on id and owner token) and its lifecycle events commit together.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from replayq.errors import (
    ConstraintViolationError,
    EffectInDoubtError,
    FailureClass,
    LeaseLostError,
    StorageError,
    classify,
    internal_error_message,
    internal_violation,
)
from replayq.model import DeadReason, Job, TraceEvent
from replayq.queue import lifecycle as trace
from replayq.queue.actions import release_target
from replayq.queue.handlers import Handler
from replayq.recording.context import Context
from replayq.storage.params import CancelRequested
from replayq.storage.protocol import (
    IdemFilter,
    JobBury,
    JobCancelRunning,
    JobReleaseRunning,
    JobRetry,
    LeaseRelease,
    TraceQuery,
    Transaction,
)
from replayq.storage.reconnect import cause_of
from replayq.worker.core import InFlight
from replayq.worker.lease import Leasing
from replayq.worker.settle import Settling

log = logging.getLogger("replayq.worker")

# An attempt the queue's own database failed is put back this many times at most; a job
# that keeps meeting it (its handler deadlocks on the database it runs in, say) then
# fails like any other, classified by its contract.
STORAGE_FAULT_RELEASES = 5


class Parking(Enum):
    """How ``Outcomes._park_internal`` ended."""

    PARKED = "parked"
    NOT_OURS = "not ours"  # the write did not apply: the lease is another's now
    REFUSED = "refused"  # both tries refused by replayq's own tables: the job stays running


class Outcomes(Settling, Leasing):
    """The state machine's last step for an attempt this worker ran."""

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

    def _stop(
        self,
        tx: Transaction,
        job: Job,
        now: float,
        hlc: int,
        reason: str,
        also: Sequence[TraceEvent] = (),
    ) -> str | None:
        """End an attempt that was asked to stop: ``cancelled``, or ``released`` back to the
        queue on the version a rollback named; ``None`` if the compare-and-set failed.
        ``also``: events traced before the outcome's, only if it applied."""
        assert job.owner_token is not None
        to_version = release_target(tx, job)
        if to_version is None:
            if not tx.job_transition(JobCancelRunning(job.id, job.owner_token, now, hlc)):
                return None
            tx.trace_append([*also, self._cancel_event(tx, job, now, hlc, reason)])
            return "cancelled"
        change = JobReleaseRunning(job.id, job.owner_token, to_version, now, hlc)
        if not tx.job_transition(change):
            return None
        stopped = self._cancel_event(tx, job, now, hlc, reason)
        released = dataclasses.replace(
            stopped,
            name=trace.JOB_RELEASED,
            status="queued",
            data={**stopped.data, "from_version": job.handler_version, "to_version": to_version},
        )
        tx.trace_append([*also, released])
        return "released"

    def _cancelled(self, job: Job, ctx: Context, reason: str, duration: float) -> None:
        """End an attempt that was asked to stop: its steps stay committed, nothing else is."""
        ctx.discard_writes()
        outcome: str | None = None

        def write(tx: Transaction) -> None:
            nonlocal outcome
            now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
            ctx.flush(tx, failed=True)
            outcome = self._stop(tx, job, now, hlc, reason)
            if outcome is None:
                raise LeaseLostError("job.cancelled")

        if self._settle_or_park(job, write, ctx, f"stop ({reason})", lambda: ["job.cancelled"]):
            ctx.committed()
            # A release (rollback --release-inflight) puts the job back in the queue.
            self.stats.cancelled += outcome == "cancelled"
            self.stats.released += outcome == "released"
            log.warning("job %s %s while running (%s)", job.id, outcome, reason)

    def _put_back(
        self,
        job: Job,
        handler: Handler,
        ctx: Context,
        exc: Exception,
        fault: StorageError,
        duration: float,
    ) -> None:
        """The queue's database failed the attempt (locked, full, read-only, unreachable,
        or the app's storage closed under it: ``errors.database_fault``):
        not the job's failure. Once the database takes writes again (``_settle`` waits it
        out), the job goes back to the queue with its attempt budget intact and its
        committed steps kept, so the next attempt resumes after them and an effect
        already recorded is not run again. ``lease.released`` says why."""
        ctx.discard_writes()
        cause = cause_of(fault)
        again = False

        def write(tx: Transaction) -> None:
            nonlocal again
            earlier = sum(
                1
                for e in tx.trace_query(TraceQuery(job_id=job.id))
                if e.name == trace.LEASE_RELEASED and "storage_fault" in e.data
            )
            if earlier >= STORAGE_FAULT_RELEASES:
                again = True
                return
            ctx.flush(tx, failed=True)
            reason = "the queue's database was unavailable during the attempt"
            if not self._release_in(tx, job, reason, storage_fault=cause):
                raise LeaseLostError("lease.released")

        put_back = f"move back to the queue ({cause})"
        if not self._settle_or_park(job, write, ctx, put_back, lambda: ["lease.released"]):
            return
        if again:
            with self._inflight_lock:
                flight = self._flight_of(job)
            if flight is not None:
                flight.ended = False  # that write changed nothing: the lease is still held
            self._fail(job, handler, ctx, exc, duration)
            return
        ctx.committed()
        self.stats.released += 1
        log.warning(
            "job %s: put back to the queue, not failed: the queue's database was unavailable "
            "during its attempt (%s)",
            job.id,
            cause,
        )

    def _release_in(
        self, tx: Transaction, job: Job, reason: str, *, started: bool = True, **data: Any
    ) -> bool:
        """Give ``job`` back to the queue inside ``tx`` (its attempt budget intact) with its
        ``lease.released`` event; ``False`` if this worker no longer holds the lease. Not
        ``started`` (leased ahead): as if never leased, its attempt taken back too."""
        now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
        assert job.owner_token is not None
        if not tx.job_transition(LeaseRelease(job.id, job.owner_token, now, hlc, started)):
            return False
        if not started:
            data["started"] = False
        released = trace.lifecycle(
            trace.LEASE_RELEASED,
            job,
            now=now,
            hlc=hlc,
            worker_id=self.worker_id,
            status="queued",
            reason=reason,
            owner_token=job.owner_token,
            **data,
        )
        tx.trace_append([released])
        return True

    def _release_all(self, jobs: list[Job], reason: str, *, started: bool = True) -> None:
        """Give ``jobs`` back to the queue in one transaction, each with ``lease.released``;
        if the database refuses, they stay running and are reaped after their lease. So
        they do if it raised another error (a bug, the app's clock erring: logged with its
        traceback), never raised: a stop whose dispatcher died of that very error still
        winds its run down (``Worker._shutdown``)."""
        if not jobs:
            return
        released = 0
        try:
            with self.runtime.storage.transaction() as tx:
                released = sum(self._release_in(tx, job, reason, started=started) for job in jobs)
        except StorageError as exc:
            log.warning(
                "worker %s: could not release jobs %s (%s); they are reaped after their lease",
                self.worker_id,
                [job.id for job in jobs],
                exc,
            )
            return
        except Exception:
            log.exception(
                "worker %s: could not release jobs %s; they are reaped after their lease",
                self.worker_id,
                [job.id for job in jobs],
            )
            return
        self.stats.released += released

    def _give_back_unstarted(self, flights: Sequence[InFlight], reason: str) -> None:
        """Give back held jobs not started (each marked ``releasing`` by the caller) and
        forget them, under their ``beat`` locks, as a settle holds its job's: a beat under
        way ends first, and none extends them after (``Heartbeat._extend`` skips a flight
        being given back). Without the locks, a beat that had listed them before they were
        forgotten ran its compare-and-set after the release committed, found the lease gone
        and traced ``lease.lost`` for a job given back cleanly. In one order of job ids, as
        a group commit takes its beats: two threads never wait on each other's."""
        ordered = sorted(flights, key=lambda f: f.job.id)
        for flight in ordered:
            flight.beat.acquire()
        try:
            try:
                self._release_all([f.job for f in ordered], reason, started=False)
            finally:
                self._forget_all([f.job for f in ordered])
        finally:
            for flight in ordered:
                flight.beat.release()

    def _fail(
        self, job: Job, handler: Handler, ctx: Context, exc: BaseException, duration: float
    ) -> None:
        """End a failed attempt: retried or ``dead`` as its class and contract say. A write
        of replayq's own refused by a constraint of its own tables (``internal_violation``:
        a step's commit, an ack) is replayq's bug, not the job's: ``dead`` at once with
        reason ``internal_error``, class ``unknown`` whatever the contract maps or retries."""
        retry = handler.contract.retry
        redactor = handler.redactor or self.runtime.redactor
        internal = internal_violation(exc)
        if internal is None:
            failure_class = classify(exc, dict(handler.error_map))
            retryable = retry.retries(failure_class)
            message = redactor.error(exc)
        else:
            failure_class, retryable = FailureClass.UNKNOWN, False
            message = redactor.text(internal_error_message(internal))
        exhausted = job.attempt >= job.max_attempts
        cancelled = False

        def write(tx: Transaction) -> None:
            nonlocal cancelled
            now = self.runtime.clock.now()
            ctx.flush(tx, failed=True)
            assert job.owner_token is not None
            # Asked to stop before the heartbeat told us: a failure ends it, never a retry.
            cancelled = job.id in {j.id for j in tx.job_list(CancelRequested(self.worker_id))}
            if cancelled:
                hlc = self.runtime.hlc.tick()
                if self._stop(tx, job, now, hlc, f"failed after the stop: {message}") is None:
                    raise LeaseLostError("job.cancelled")
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
                    traceback=redactor.text(traceback.format_exception_only(exc)[-1].strip()),
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
                elif internal is not None:
                    reason = DeadReason.INTERNAL_ERROR
                events.append(self._bury_in(tx, job, reason, failure_class, message, now, hlc))
            tx.trace_append(events)

        def dropped() -> list[str]:
            retrying = retryable and not exhausted and not cancelled
            return ["job.failed", "its retry (retry.scheduled)"] if retrying else ["job.failed"]

        if self._settle_or_park(job, write, ctx, f"failure ({message})", dropped):
            ctx.committed()
            if cancelled:
                self.stats.cancelled += 1
            elif retryable and not exhausted:
                self.stats.retried += 1
                log.warning("job %s failed (%s), retrying: %s", job.id, failure_class, message)
            else:
                self.stats.dead += 1
                log.error("job %s failed (%s), dead: %s", job.id, failure_class, message)

    def _settle_or_park(
        self,
        job: Job,
        write: Any,
        ctx: Context | None,
        settling: str,
        dropped: Callable[[], list[str]],
    ) -> bool:
        """``_settle(job, write, ctx)``, but a write refused by a constraint of replayq's own
        tables (``internal_violation``: a bug of replayq's) parks the job (``_park``)
        instead of raising: the same write is refused every time, and left ``running``
        the job would be reaped and run again until its attempts ran out. ``settling``
        names the outcome refused, ``dropped()`` (read after the refusal) its events
        dropped. ``True`` only if ``write`` committed."""
        try:
            return self._settle(job, write, ctx)
        except ConstraintViolationError as refused:
            violation = internal_violation(refused)
            if violation is None:
                raise
            self._park(job, ctx, violation, settling, dropped())
            return False

    def _park(
        self,
        job: Job,
        ctx: Context | None,
        violation: ConstraintViolationError,
        settling: str,
        dropped_events: Sequence[str],
    ) -> None:
        """An attempt's own settle (``settling``: its failure, stop, move back to the queue
        or burial) was refused by a constraint of replayq's own tables (``violation``):
        park the job as ``dead`` / ``internal_error`` with what the settle could not write
        said in its message and the log. Its ``job.dead`` event alone, or, if that too is
        refused, the job row alone: the attempt's pending trace events (and their blobs)
        and the settle's own events (``dropped_events``: ``job.failed``, say) are dropped,
        and a retry is not scheduled. A pending lock release is made on its own when the
        context is released (``LockManager.abandon``). If even the job row's move to
        ``dead`` is refused, the job stays ``running`` (logged as an error naming the
        refusal): it is reaped after its lease."""
        pending = [event.name for event in ctx._pending.events] if ctx is not None else []
        dropped = [
            f"{len(pending)} pending trace events ({', '.join(sorted(set(pending)))})"
            if pending
            else "no pending trace events",
            *dropped_events,
        ]
        redactor = ctx.redactor if ctx is not None else self.runtime.redactor
        base = (
            f"{internal_error_message(violation)}; settling the attempt's {settling} "
            f"was refused, parked without: {', '.join(dropped)}"
        )
        parked = self._park_internal(
            job,
            (redactor.text(base), redactor.text(f"{base}, job.dead")),
            lambda write: self._settle(job, write),
            "failed (unknown)",
        )
        if parked is Parking.REFUSED:
            log.error(
                "job %s could not be parked: replayq's own tables refused its move to dead; "
                "it stays running and is reaped after its lease",
                job.id,
            )

    def _park_internal(
        self,
        job: Job,
        messages: tuple[str, str],
        commit: Callable[[Callable[[Transaction], None]], bool],
        ended: str,
    ) -> Parking:
        """Park ``job``, held by this worker, as ``dead`` / ``internal_error`` after a
        constraint of replayq's own tables refused a write of it: its ``job.dead`` event
        with it (``messages[0]`` its message), or, if that too is refused, the job row
        alone (``messages[1]``). ``commit(write)`` runs a write in one transaction (the
        caller's: ``_settle``, say), ``False`` if it did not apply (the lease is not ours
        any more). A refusal that is not replayq's own is raised; each refused try is
        logged, and so is the park (``job <id> <ended>, dead: <message>``). ``PARKED``
        (counted in ``stats.dead``), ``NOT_OURS``, or ``REFUSED`` if both were refused."""
        for with_event, message in zip((True, False), messages, strict=True):

            def write(
                tx: Transaction, message: str = message, with_event: bool = with_event
            ) -> None:
                now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
                dead = self._bury_in(
                    tx, job, DeadReason.INTERNAL_ERROR, FailureClass.UNKNOWN, message, now, hlc
                )
                if with_event:
                    tx.trace_append([dead])

            try:
                if not commit(write):
                    return Parking.NOT_OURS
            except ConstraintViolationError as again:
                if internal_violation(again) is None:
                    raise
                log.error(
                    "job %s: parking it as internal_error%s was refused too (%s)",
                    job.id,
                    " with its job.dead event" if with_event else "",
                    again,
                )
                continue
            self.stats.dead += 1
            log.error("job %s %s, dead: %s", job.id, ended, message)
            return Parking.PARKED
        return Parking.REFUSED

    def _bury(
        self, job: Job, reason: DeadReason, failure_class: FailureClass | None, message: str
    ) -> None:
        def write(tx: Transaction) -> None:
            now, hlc = self.runtime.clock.now(), self.runtime.hlc.tick()
            tx.trace_append([self._bury_in(tx, job, reason, failure_class, message, now, hlc)])

        burial = f"burial ({reason.value}: {message})"
        if self._settle_or_park(job, write, None, burial, lambda: []):
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
