"""Group commit: the acks of several successes in one transaction, never one held open.

A success's ack (its handler's pending writes, the compare-and-set on its owner
token, ``job.succeeded``) waits in memory, not in a transaction. The buffer is
committed as one transaction when an executor has nothing left to run (that
transaction also leases the slots it frees: acks and the next batch commit
together), or by the ``replayq-acks`` thread once the oldest ack has waited
``ack_window`` seconds (its transaction leases the freed slots too). A transaction
is opened only to flush and committed at once: no thread waits for others with one
open.

What the group promises:

* Each ack is still a compare-and-set. A job whose lease was lost (or whose writes
  are refused) rolls the group back; the group commits again without it, and that
  job is settled alone (``write.rejected``, or a failed attempt). No savepoints.
* A group that fails to commit acks none of its jobs: they stay ``running``, held
  by this worker, their leases still heartbeated, and the group is tried again
  after a backoff. At the end of the shutdown grace it gives up; the jobs are then
  reaped after their lease and run again (at-least-once, as any lost ack).
* Unless the database refused it for something one of its acks wrote (any failure but
  the database being away, ``DatabaseUnavailableError``): a group of more than one ack
  is then split in halves, each committed at once without the other (and split again
  if it fails), so that the good acks commit and only the one at fault is left. An ack
  whose commit alone is refused by a constraint (``ConstraintViolationError``: the
  handler's ``ctx.db_write`` colliding with a unique key, say) is the attempt's
  failure, its writes discarded, classified as any (``validation``: ``dead`` with the
  constraint named): the same write would be refused on every run, so it is neither
  tried again nor given up to be reaped and run again. A constraint of replayq's own
  tables (``rq_*``) refusing it is replayq's bug, not the job's: ``dead`` as
  ``internal_error`` (``Outcomes._fail``). An ack whose commit alone raised something
  that is not the database's (a ``ctx.db_write`` function's error, ``KeyboardInterrupt``
  and ``SystemExit`` among them: no signal raises those in the worker's threads) fails its
  attempt the same way, classified; so does an ack made alone (``_succeed``).
* On PostgreSQL a group is two round trips (``Transaction.pipelined``): ``BEGIN``, the
  compare-and-sets and the lease in one, the trace insert and ``COMMIT`` in the other;
  the compare-and-sets' answer is read before ``COMMIT`` is sent.
* A buffered ack never outlives its lease unnoticed: the heartbeat keeps extending
  a job's lease until its ack commits, and the window is milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence

from msgspec import Struct

from replayq.errors import (
    ConstraintViolationError,
    DatabaseUnavailableError,
    JobError,
    LeaseCollisionError,
    LeaseLostError,
    ReplayqError,
    StatementCancelledError,
    StorageClosedError,
    StorageError,
)
from replayq.model import Job, TraceEvent
from replayq.queue import lifecycle as trace
from replayq.queue.handlers import Handler
from replayq.recording.context import Context
from replayq.storage.protocol import JobsComplete, Transaction
from replayq.storage.reconnect import FIRST_DELAY, MAX_DELAY
from replayq.worker.core import InFlight
from replayq.worker.outcome import Outcomes

log = logging.getLogger("replayq.worker")

# A group whose commit failed (rolled back for sure) this many times is given up: its
# jobs stay running and are reaped after their lease, as a single settle does.
_GROUP_STORAGE_TRIES = 5
# The acks thread's longest sleep with nothing buffered.
_IDLE_WAKE = 1.0
# For this long after acks were last buffered, the acks thread sleeps one ``ack_window``
# at a time: acks buffered meanwhile are due after its wake-up, so they need no wake-up.
_BUSY_SECONDS = 0.1


# Compared by identity: the buffer removes the very acks it took.
class Ack(Struct, eq=False):
    """A success waiting in memory for its group commit."""

    job: Job
    handler: Handler
    ctx: Context
    result_json: str
    duration: float
    since: float  # monotonic time it was buffered
    retry_at: float = 0.0
    failures: int = 0
    # A commit of its group may have landed although its reply was lost.
    outcome_unknown: bool = False
    # Its group's tries in a row that met a closed storage (``_reopened``).
    closed: int = 0
    # Its group's tries whose statement the server cancelled (``_cancelled_again``).
    cancelled: int = 0


class _Refused(ReplayqError):
    """One ack of a group was refused: the group rolls back and commits without it."""

    def __init__(self, ack: Ack, cause: LeaseLostError | JobError) -> None:
        super().__init__(str(cause))
        self.ack = ack
        self.cause = cause


class Acking(Outcomes):
    """Buffer successes and commit them in groups."""

    def _succeed(
        self, job: Job, handler: Handler, ctx: Context, result_json: str, duration: float
    ) -> None:
        """Ack ``job`` with the handler's pending writes and its ``job.succeeded`` event.

        In a running worker the ack waits in memory for a group commit (``acks.py``).
        Acked at once instead: a job whose type has routing (shadow and dual-run
        compare the settled attempt right after) and a job run by ``execute()`` on its
        own. Observers (metrics, OpenTelemetry) hear that a grouped attempt settled
        when its group commits (``Observer.settled``).
        """
        ack = Ack(job, handler, ctx, result_json, duration, time.monotonic())
        if self._grouping and not self.router.is_routed(job.job_type):
            self._ack_later(ack)
            return
        try:
            settled = self._settle(job, lambda tx: self._ack_in(tx, ack), ctx, ack=True)
        except StatementCancelledError as exc:
            # Cancelled on every try (``_settle``): the database failed the attempt, as a
            # step's commit cancelled so; put back (``Outcomes._put_back``).
            self._put_back(job, handler, ctx, exc, exc, duration)
            return
        except BaseException as exc:
            # Rolled back: the commit refused the handler's writes made outside steps (a
            # version conflict, a stale fencing token, a constraint such as a unique key),
            # or a ``ctx.db_write`` function raised in it. The attempt's failure,
            # classified, its writes discarded, as a group's ack alone (``_settle_refused``).
            # (Any other storage error ``_settle`` waits out or gives up: the job is left
            # running, reaped and run again, never buried for the database's fault.)
            ctx.discard_writes()
            self._fail(job, handler, ctx, exc, duration)
            if not isinstance(exc, Exception):
                raise  # ``KeyboardInterrupt``, ``SystemExit``: on to the caller, settled
            return
        if settled:
            self._acked(ack)

    def _ack_in(self, tx: Transaction, ack: Ack) -> None:
        """The ack of one success inside ``tx`` (``_acks_in`` of one)."""
        try:
            self._acks_in(tx, [ack])
        except _Refused as refused:
            raise refused.cause from None

    def _acks_in(self, tx: Transaction, acks: Sequence[Ack]) -> None:
        """The acks of successes inside ``tx``: each one's writes; every ack's events and
        ``job.succeeded`` in one append (new packs in one statement); then one
        compare-and-set for them all (``jobs_complete``), each row on its own owner
        token. ``_Refused`` names the first ack refused (its writes, or its lease lost):
        the caller rolls ``tx`` back."""
        events: list[TraceEvent] = []
        done = self._acks_written(tx, acks, events)
        tx.trace_append(events)
        _held(acks, tx.jobs_complete(done))

    def _acks_written(
        self, tx: Transaction, acks: Sequence[Ack], events: list[TraceEvent]
    ) -> JobsComplete:
        """Each ack's writes inside ``tx``, its events and ``job.succeeded`` added to
        ``events``; the compare-and-set that acks them all (``jobs_complete``), for the
        caller to run. ``_Refused`` names the first ack whose writes were refused."""
        now = self.runtime.clock.now()
        done: list[tuple[int, str, str | None, int]] = []
        clock = self.runtime.hlc
        ordered = False  # a job with an ordering key among them (``JobsComplete.ordered``)
        for ack in acks:
            job = ack.job
            assert job.owner_token is not None
            if job.ordering_key is not None:
                ordered = True
            hlc = clock.tick_at(now)  # stamped at the event's time: one clock read a group
            # Asked to stop after its handler returned (a cancel the handler could have seen
            # ends the attempt cancelled, ``Executing._attempt``): too late, it is acked.
            late: dict[str, bool] = {"cancel_too_late": True} if ack.ctx.cancel_requested else {}
            succeeded = trace.lifecycle(
                trace.JOB_SUCCEEDED,
                job,
                now=now,
                hlc=hlc,
                worker_id=self.worker_id,
                owner_token=job.owner_token,
                status="succeeded",
                duration=ack.duration,
                version=ack.handler.contract.version,
                **late,
            )
            try:
                ack.ctx.flush(tx, events_to=events)
            except JobError as exc:
                raise _Refused(ack, exc) from exc
            events.append(succeeded)
            done.append((job.id, job.owner_token, ack.result_json, hlc))
        return JobsComplete(now, done, ordered)

    def _acked(self, ack: Ack, *, logged: bool = True) -> None:
        ack.ctx.committed()
        self.stats.succeeded += 1
        learning = self._pack_learning()
        if learning is not None:  # two a type: its trace pack dictionary learned from them
            learning.pack_dictionaries.succeeded(ack.job.job_type, ack.job.id)
        if logged:
            _log_group((ack,))

    # -- the buffer -------------------------------------------------------------------------

    def _ack_later(self, ack: Ack) -> None:
        """Buffer ``ack`` for the next group; it keeps its slot and its lease is beaten."""
        self._deferred.job_id = ack.job.id  # the observers hear of it from the group commit
        with self._inflight_lock:
            flight = self._flight_of(ack.job)
            if flight is not None:
                flight.acking = True
        with self._acks_lock:
            self._acks.append(ack)
        # The acks thread is not woken here: an executor with nothing else to run commits
        # the buffer itself at once; one that goes on to another job arms it (``_arm_acks``).

    def _arm_acks(self) -> None:
        """Have the acks thread commit the buffer when its window ends (an executor goes on
        to another job while acks wait). Once per stretch of a non-empty buffer: the
        thread stays armed until it finds the buffer empty."""
        with self._acks_lock:
            if not self._acks or self._acks_armed:
                return
            self._acks_armed = True
            self._acks_last_armed = now = time.monotonic()
            # Asleep until before the buffer is due (a busy worker's thread wakes every
            # window): it finds these acks then. A wake-up per batch cost more CPU than it.
            if now < self._acks_wake_at <= self._acks_due():
                return
        self._acks_wake.set()

    def _acks_due(self) -> float:
        """When the buffer must be committed (under ``_acks_lock``); ``inf`` if empty.
        A group that failed is tried again at its backoff, not after the window."""
        return min(
            (a.retry_at if a.failures else a.since + self.ack_window for a in self._acks),
            default=math.inf,
        )

    def _take_acks(self, *, all_of_them: bool = False) -> list[Ack]:
        now = time.monotonic()
        with self._acks_lock:
            taken = [a for a in self._acks if all_of_them or a.retry_at <= now]
            if taken:
                self._acks = [a for a in self._acks if a not in taken]
        return taken

    def _acks_thread(self) -> None:
        """Commit the buffer once its oldest ack has waited ``ack_window`` seconds."""
        while not (self._ended.is_set() and not self._acks):
            self._acks_wake.clear()  # before the look: an arm after it wakes the wait below
            with self._acks_lock:
                due = self._acks_due()
                self._acks_armed = not math.isinf(due)
                now = time.monotonic()
                # Jobs left queued beside sleeping executors are looked at too (``_hand_out``).
                watch = self._watch_queue(now)
                busy = self.ack_window > 0 and now - self._acks_last_armed < _BUSY_SECONDS
                # Never past _IDLE_WAKE: with ``ack_window`` inf a busy wait would be inf,
                # which ``Event.wait`` refuses (OverflowError ended this thread).
                wait = min(due - now, watch - now, self.ack_window if busy else _IDLE_WAKE)
                wait = min(wait, _IDLE_WAKE)
                # Under the lock: ``_arm_acks`` wakes this thread only if it sleeps past due.
                self._acks_wake_at = now + wait if wait > 0 else 0.0
            if wait > 0:
                self._acks_wake.wait(wait)
                continue
            # The slots these acks free are leased in the same transaction, as an
            # executor's group commit does: not in one more of their own afterwards.
            self._flush_acks(refill=True)
            if self._ended.is_set() and self._force.is_set():
                self._give_up(self._take_acks(all_of_them=True))

    def _flush_acks(self, *, refill: bool = False, all_of_them: bool = False) -> list[Job]:
        """Commit the buffered acks (those not backing off, unless ``all_of_them``) in one
        transaction; with ``refill``, the slots they free are leased in it. Returns the
        jobs leased (already held)."""
        acks = self._take_acks(all_of_them=all_of_them)
        if not acks:
            return []
        return self._commit_group(acks, refill=refill)

    # -- one group --------------------------------------------------------------------------

    def _commit_group(self, acks: list[Ack], *, refill: bool) -> list[Job]:
        pending = list(acks)
        # The lease after the acks runs without a savepoint until a claim collides on an
        # ordering key (rare: two claimers whose snapshots differ); then in one.
        collision_aborts = True
        while pending:
            try:
                leased = self._commit_once(
                    pending, refill=refill, collision_aborts=collision_aborts
                )
            except _Refused as refused:
                # Rolled back: the group commits again without the refused one.
                pending.remove(refused.ack)
                self._settle_refused(refused.ack, refused.cause)
                continue
            except LeaseCollisionError:
                # Rolled back whole, nothing of it written: the same group again at once.
                log.debug("group commit's lease collided on an ordering key; committing again")
                collision_aborts = False
                continue
            except StorageError as exc:
                if _cancelled_again(pending, exc):
                    # Cancelled by the server try after try: maybe one ack's own write
                    # outlasts the ``statement_timeout`` (a ``ctx.db_write``), which waited
                    # out as an outage held its job and every ack grouped with it for good.
                    # Split, to commit the others; one alone is put back (``_settle_refused``).
                    if len(pending) > 1:
                        return self._split(pending, exc)
                    self._settle_refused(pending[0], exc)
                    return []
                if isinstance(exc, DatabaseUnavailableError) or _reopened(pending, exc):
                    self._group_failed(pending, exc)
                    return []
                if len(pending) > 1:
                    # Refused for what one of them wrote, maybe: the others are not held
                    # back by it (nor given up with it).
                    return self._split(pending, exc)
                if refill and isinstance(exc, ConstraintViolationError):
                    # The lease in the same transaction may be what was refused (a claim
                    # colliding on an ordering key): the ack alone first.
                    refill = False
                    continue
                if isinstance(exc, ConstraintViolationError | StorageClosedError):
                    # A closed storage met again and again: not the app's, which the first
                    # try after its close replaced, but one the ack's own writes use (a
                    # ``ctx.db_write`` function's). Its attempt's failure, classified, as a
                    # function raising below; tried again whole, it held the job for good.
                    self._settle_refused(pending[0], exc)
                    return []
                self._group_failed(pending, exc)
                return []
            except BaseException as exc:
                # (``KeyboardInterrupt``, ``SystemExit`` too: a ``ctx.db_write`` function's,
                # raised in a thread of the worker's, where no signal raises them.)
                if refill:
                    # Rolled back: maybe the lease's fault (a bug, the app's clock erring), not
                    # the acks'. They commit again without it (the dispatcher leases the
                    # slots): given up, the jobs whose handlers succeeded would run again.
                    # If it raised once committed (its lease's hold), the acks landed: a
                    # refusal then reads the trace before calling it one (``_settle_refused``).
                    log.exception(
                        "worker %s: group commit failed; its acks commit without the lease",
                        self.worker_id,
                    )
                    for ack in pending:
                        ack.outcome_unknown = True
                    refill = False
                    continue
                if len(pending) > 1:
                    # Raised by what one of them wrote, maybe (a handler's ``ctx.db_write``
                    # function): the others are not held back by it, nor given up with it.
                    return self._split(pending, exc)
                # Raised for this ack alone: its attempt's failure, classified (a handler's
                # ``ctx.db_write`` function raising at the commit, or a bug), its writes
                # discarded. Given up, the job would be reaped and run again, raising again.
                log.exception("worker %s: job %s's ack failed", self.worker_id, pending[0].job.id)
                self._settle_refused(pending[0], exc)
                return []
            if self._acks_outage.failures:
                with self._acks_outage_lock:
                    self._acks_outage.reset()  # logs the outage's end
            for ack in pending:
                self._acked(ack, logged=False)
                ack.ctx.release()
            _log_group(pending)  # before the slots free: a burst run may end right after
            settled = [ack.job for ack in pending]
            self._forget_all(settled)
            self.observers.settled_all(settled)
            return leased
        return []

    def _commit_once(
        self, acks: Sequence[Ack], *, refill: bool, collision_aborts: bool = False
    ) -> list[Job]:
        """One try: every ack, then (with ``refill``) the lease of the free slots; with
        ``collision_aborts`` that lease needs no savepoint, and a collision on an ordering
        key aborts the try (``LeaseCollisionError``)."""
        flights = self._flights_of(acks)
        for flight in flights:
            flight.beat.acquire()  # the heartbeat skips a lease while its ack commits
        # One thread leases at a time (the dispatcher may be in a lease of its own: waited
        # for here, before this transaction opens, never inside it).
        leasing = refill and not self._stopping.is_set()
        if leasing:
            self._lease_lock.acquire()
        leased: list[Job] = []
        leased_at = 0.0
        # Before the lease is sent (``InFlight.held_until``); no reading for a group that
        # leases nothing.
        held_at = time.monotonic() if leasing else 0.0
        try:
            with self.runtime.storage.transaction() as tx:
                # The handlers' writes wait each for its result, as in any transaction.
                events: list[TraceEvent] = []
                done = self._acks_written(tx, acks, events)
                # Then the compare-and-set, the lease and the trace insert end the
                # transaction (PostgreSQL: pipelined, two round trips with BEGIN and
                # COMMIT). The compare-and-set's answer is read before the commit: an ack
                # refused rolls the group back.
                # (A try after a collision claims in a savepoint: not pipelined.)
                with tx.pipelined() if collision_aborts else contextlib.nullcontext():
                    held = tx.jobs_complete_sent(done)
                    free, ahead = self._slots(acking=len(flights)) if leasing else (0, 0)
                    if free > 0:
                        # The acks' events go in with the lease batch's ``job.leased`` (one
                        # insert); the acks just written free their slots.
                        leased, leased_at = self._lease_in(
                            tx, free, ahead, also=events, collision_aborts=collision_aborts
                        )
                    else:
                        tx.trace_append(events)
                    _held(acks, held())
            for flight in flights:
                flight.ended = True  # acked, under its ``beat``: beaten no more
            self._hold(leased, leased_at, held_at)
        finally:
            if leasing:
                self._lease_lock.release()
            for flight in flights:
                flight.beat.release()
        return leased

    def _flights_of(self, acks: Sequence[Ack]) -> list[InFlight]:
        with self._inflight_lock:
            flights = [self._flight_of(ack.job) for ack in acks]
        # One order for every group: two threads never wait on each other's beats.
        return sorted((f for f in flights if f is not None), key=lambda f: f.job.id)

    def _split(self, acks: list[Ack], exc: BaseException) -> list[Job]:
        """A group of several acks refused for something other than the database being
        away (or that raised): each half committed at once without the other (split again
        if it fails), so that the acks not at fault commit now and only the one that is
        fails alone.
        Nothing is leased: the executors lease their free slots as usual."""
        log.warning(
            "worker %s: group commit of the acks of jobs %s failed (%s); committed in "
            "halves, to leave out the one at fault",
            self.worker_id,
            [ack.job.id for ack in acks],
            exc,
        )
        half = len(acks) // 2
        self._commit_group(acks[:half], refill=False)
        self._commit_group(acks[half:], refill=False)
        return []

    def _settle_refused(self, ack: Ack, cause: BaseException) -> None:
        """Settle alone the ack its group refused, for good: its lease lost, its writes
        refused (by their own check, a version conflict or a stale fencing token, or by a
        constraint of the database), or its commit raising for it alone."""
        try:
            if ack.outcome_unknown and self._settled_by_this_attempt(ack.job):
                # An earlier try of its group committed (only its reply was lost): its
                # writes are in, which is why this try was refused.
                self._acked(ack)
            elif isinstance(cause, LeaseLostError):
                self._reject(ack.job, cause, ack.ctx)
            elif isinstance(cause, StatementCancelledError):
                # Its commit cancelled again and again: the database failed the attempt,
                # as a step's commit cancelled so (put back, at most
                # ``STORAGE_FAULT_RELEASES`` times, then failed as any such attempt).
                self._put_back(ack.job, ack.handler, ack.ctx, cause, cause, ack.duration)
            else:
                # The commit refused the handler's writes made outside steps (a version
                # conflict, a stale fencing token, a constraint): a failure of the
                # attempt, classified; its writes are not tried again.
                ack.ctx.discard_writes()
                self._fail(ack.job, ack.handler, ack.ctx, cause, ack.duration)
        except Exception:
            log.exception("worker %s: job %s could not be settled", self.worker_id, ack.job.id)
        finally:
            ack.ctx.release()
            self._forget(ack.job)
            self.observers.settled(ack.job)

    def _group_failed(self, acks: list[Ack], exc: StorageError) -> None:
        """Nothing of the group committed (or, unreachable, maybe all of it): back to the
        buffer after a backoff, its leases still heartbeated."""
        unavailable = isinstance(exc, _AWAY)
        starts = True
        if unavailable:
            # The database away: a warning as the outage starts (or its cause changes), the
            # retries of every group until it ends debug records, and its end logged by the
            # next group that commits (``_acks_outage``), as the other loops log theirs.
            with self._acks_outage_lock:
                starts = self._acks_outage.failed(exc)
        (log.warning if starts else log.debug)(
            "worker %s: group commit of the acks of jobs %s failed (%s); tried again",
            self.worker_id,
            [ack.job.id for ack in acks],
            exc,
        )
        retry, given_up = [], []
        closed = isinstance(exc, StorageClosedError)
        cancelled = isinstance(exc, StatementCancelledError)
        for ack in acks:
            ack.failures += 1
            ack.closed = ack.closed + 1 if closed else 0
            ack.cancelled += cancelled
            ack.outcome_unknown = ack.outcome_unknown or unavailable
            if self._force.is_set() or (not unavailable and ack.failures >= _GROUP_STORAGE_TRIES):
                given_up.append(ack)
                continue
            ack.retry_at = time.monotonic() + min(FIRST_DELAY * 2**ack.failures, MAX_DELAY)
            retry.append(ack)
        self._give_up(given_up)
        if retry:
            with self._acks_lock:
                self._acks.extend(retry)
            self._arm_acks()

    def _give_up(self, acks: Sequence[Ack]) -> None:
        if not acks:
            return
        log.error(
            "worker %s: gave up the acks of jobs %s; they stay running and are reaped "
            "after their lease",
            self.worker_id,
            [ack.job.id for ack in acks],
        )
        for ack in acks:
            ack.ctx.release()
            self._forget(ack.job)
            self.observers.settled(ack.job)


# The database away, for a group commit: tried again whole after a backoff, never split
# nor given up before the grace ends. The app's storage closed under the commit
# (``App.close()`` while the worker runs) is that too: the app opens a new one (see
# ``_reopened``).
_AWAY = (DatabaseUnavailableError, StorageClosedError)
# Tries in a row of one group that may meet a closed storage before it is not taken for
# the app's (closed under the worker) any more.
_CLOSED_TRIES = 5


def _reopened(acks: Sequence[Ack], exc: StorageError) -> bool:
    """Whether ``exc`` is a closed storage that the group's next try can expect to find
    open again: the app's, closed under the worker, is opened anew at the next try's
    ``runtime.storage``. One met ``_CLOSED_TRIES`` times in a row is closed for good (a
    storage of the handler's own, used by a ``ctx.db_write`` function): the group is then
    split and the ack at fault fails (``_commit_group``), never retried without end."""
    return isinstance(exc, StorageClosedError) and all(a.closed < _CLOSED_TRIES for a in acks)


def _cancelled_again(acks: Sequence[Ack], exc: StorageError) -> bool:
    """Whether ``exc`` is the server cancelling a statement of a group one of whose acks
    has been cancelled ``_GROUP_STORAGE_TRIES`` times already: no longer taken for a
    passing fault (a lock held a while, an operator's cancel) but maybe an ack's own."""
    return isinstance(exc, StatementCancelledError) and any(
        a.cancelled >= _GROUP_STORAGE_TRIES for a in acks
    )


def _held(acks: Sequence[Ack], held: set[int]) -> None:
    """``_Refused`` for the first of ``acks`` whose compare-and-set did not hold."""
    for ack in acks:
        if ack.job.id not in held:
            raise _Refused(ack, LeaseLostError("job.succeeded"))


def _log_group(acks: Sequence[Ack]) -> None:
    """One log line for a group's successes: a line per job cost a no-op job a fifth of
    its CPU (formatting, redaction and a write to stderr each)."""
    if len(acks) == 1:
        log.info("job %s succeeded in %.3fs", acks[0].job.id, acks[0].duration)
    elif acks and log.isEnabledFor(logging.INFO):
        each = ", ".join(f"{ack.job.id} in {ack.duration:.3f}s" for ack in acks)
        log.info("%d jobs succeeded (one group commit): %s", len(acks), each)
