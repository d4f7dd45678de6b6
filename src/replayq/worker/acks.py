"""Acking: the successes of several jobs commit together (group commit).

An executor whose job succeeded hands its ack over. When the ack may wait (nothing
of the attempt's own is pending but its events; no lock, no shadow run, no observer
following the attempt) and a leased-ahead job is at hand, the executor starts that
job at once and the ack gathers with others. An executor with nothing else to run
commits what has gathered, its own ack with it, on its own thread (the leader of
the group: no hand-off) unless a commit is under way, whose thread then takes the
next group. Acks no executor waits for are committed by the heartbeat thread
between its beats, ``ack_window`` seconds (at least one beat, 50 ms) after the first
of them: no thread or pooled connection of their own.

In that transaction every ack is still a compare-and-set on (job id, owner
token), run *before* anything else of its job is written: an ack whose lease is
gone writes nothing, the others commit, and it is traced ``write.rejected`` as a
lone settle is. Each job's pending writes and events are written after its own
compare-and-set, in the same transaction: an ack never commits without them.
The same transaction leases the slots the acks free (one lease statement for the
group). If the group fails (a storage error, a write of one job refused by the
store) nothing of it committed: each ack is then settled on its own, as before
group commit, so no job is lost and none is acked twice.

What a crash can leave: a worker killed with acks not yet committed leaves those
jobs ``running``; they are reaped after their lease and run again, like a job
whose worker died just before its settle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from replayq.errors import DatabaseUnavailableError, JobError, LeaseLostError
from replayq.model import Job
from replayq.observe.logs import job_fields
from replayq.queue.handlers import Handler
from replayq.recording.context import Context
from replayq.storage.protocol import Transaction
from replayq.worker.lease import Leasing
from replayq.worker.settle import Settling

log = logging.getLogger("replayq.worker")


@dataclass(eq=False)
class Ack:
    """A succeeded attempt waiting for its commit."""

    job: Job
    handler: Handler
    ctx: Context
    duration: float
    # The ack's write into a transaction: its compare-and-set first (``LeaseLostError``
    # with nothing written when the lease is gone), then its writes and events.
    write: Callable[[Transaction], None]
    # Once committed: forget the pending record, count it, log it.
    committed: Callable[[], None]
    queued: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)


class Acking(Settling, Leasing):
    """Gather acks and commit them in groups (led by a waiting executor, or the
    heartbeat thread for acks nobody waits for)."""

    def _ack(self, ack: Ack, *, wait: bool, refill: bool) -> None:
        """Hand ``ack`` over for the next group; with ``wait``, return once it is settled.

        A caller that waits commits the group itself when no commit is under way (no
        thread hand-off: the leader of a group commit); else it takes the next group
        once that commit ends. Outside ``run()`` (``execute()`` called on its own) it
        commits here, on its own, leasing the slot it frees only with ``refill``.
        """
        if not self._running_batches:
            self._settle_acks([ack], refill=refill, forget=False)  # the caller frees the slot
            return
        with self._acks_wake:
            self._acks.append(ack)
            if not wait:
                return
        self._lead_until([ack])

    def _flush_acks(self) -> None:
        """Commit the gathered acks now; return once those handed over so far are settled."""
        with self._acks_wake:
            pending = [*self._acks, *self._acks_batch]
        if pending:
            self._lead_until(pending)

    def _lead_until(self, pending: Sequence[Ack]) -> None:
        """Until every ack of ``pending`` is settled: commit what has gathered on this
        thread whenever no commit is under way, else wait for the one that is."""
        while True:
            with self._acks_wake:
                if all(ack.done.is_set() for ack in pending):
                    return
                if self._acks_committing or not self._acks:
                    self._acks_flush = True
                    self._acks_wake.notify_all()
                    self._acks_waiters += 1
                    try:
                        self._acks_wake.wait(0.1)
                    finally:
                        self._acks_waiters -= 1
                    continue
                batch = self._take_acks()
            self._commit_taken(batch)

    def _take_acks(self) -> list[Ack]:
        """The gathered acks, now this thread's to commit (``_acks_wake`` held)."""
        batch, self._acks, self._acks_flush = self._acks, [], False
        self._acks_batch = batch
        self._acks_committing = True
        return batch

    def _commit_taken(self, batch: list[Ack]) -> None:
        try:
            self._settle_acks(batch, refill=True)
        finally:
            with self._acks_wake:
                self._acks_committing = False
                self._acks_batch = []
                # Wake only a waiting executor (a wake-up costs more than the SQL).
                if self._acks_waiters:
                    self._acks_wake.notify_all()

    def _commit_due(self) -> None:
        """Commit the gathered acks once the oldest is ``ack_window`` old (or a flush was
        asked for) and no commit is under way: acks no executor waits for (each went
        on to a job leased ahead). Run by the heartbeat thread, between its beats, so
        group commits take no connection of their own beyond the executors' and the
        heartbeat's. A failed group is settled ack by ack on a thread of its own: its
        retries (while the database is away) must not hold up the heartbeats."""
        with self._acks_wake:
            if self._acks_committing or not self._acks:
                return
            if not self._acks_flush and time.monotonic() < self._acks[0].queued + self.ack_window:
                return
            batch = self._take_acks()
        failure: Exception | None = None
        try:
            failure = self._commit_acks(batch, True, True, alone=False)
        except Exception:  # never let the heartbeat die: the jobs are reaped after their lease
            log.exception("worker %s: acks could not be settled", self.worker_id)
        if failure is None:
            self._finish_taken(batch)
            return
        failed = failure

        def alone() -> None:
            try:
                self._settle_alone(batch, failed)
            finally:
                self._finish_taken(batch)

        threading.Thread(target=alone, name="replayq-acks-alone", daemon=True).start()

    def _finish_taken(self, batch: Sequence[Ack]) -> None:
        for ack in batch:
            self._forget(ack.job)
            ack.done.set()
        with self._acks_wake:
            self._acks_committing = False
            self._acks_batch = []
            if self._acks_waiters:
                self._acks_wake.notify_all()

    def _settle_acks(self, batch: Sequence[Ack], *, refill: bool, forget: bool = True) -> None:
        """Commit ``batch`` and (with ``forget``) free its slots, whatever happens."""
        try:
            self._commit_acks(batch, refill, forget)
        except Exception:  # never let the committing thread die: reaped after their lease
            log.exception("worker %s: acks could not be settled", self.worker_id)
        finally:
            for ack in batch:
                if forget:
                    self._forget(ack.job)
                ack.done.set()

    def _commit_acks(
        self, batch: Sequence[Ack], refill: bool, forget: bool, *, alone: bool = True
    ) -> Exception | None:
        """One transaction for ``batch``: every ack whose lease holds, and the refill.

        If it fails, each ack is settled on its own here (``alone``), else the failure
        is returned for the caller to do so."""
        flights = sorted(
            (f for f in (self._flight_of(a.job) for a in batch) if f is not None),
            key=lambda f: f.job.id,
        )
        rejected: list[Ack] = []
        leased: list[Job] = []
        leased_at = 0.0
        failure: Exception | None = None
        for flight in flights:
            flight.beat.acquire()
        try:
            with self.runtime.storage.transaction() as tx:
                for ack in batch:
                    try:
                        ack.write(tx)
                    except LeaseLostError:
                        rejected.append(ack)  # its compare-and-set wrote nothing
                if refill:
                    leased, leased_at = self._refill(tx, len(batch) - len(rejected))
        except Exception as exc:
            failure = exc
        finally:
            for flight in flights:
                flight.beat.release()
        if failure is not None:
            if not alone:
                return failure
            self._settle_alone(batch, failure)
            return None
        lost = {id(a) for a in rejected}
        for ack in batch:
            if forget and id(ack) not in lost:
                self._forget(ack.job)  # before the refill is held: capacity stays as leased
        self._hold(leased, leased_at)
        for ack in batch:
            if id(ack) in lost:
                with job_fields(ack.job, self.worker_id):
                    self._reject(ack.job, LeaseLostError("job.succeeded"), ack.ctx)
            else:
                ack.committed()
        return None

    def _refill(self, tx: Transaction, acked: int) -> tuple[list[Job], float]:
        """Lease, in the acks' transaction, for the slots they free (none when stopping,
        nor while another thread is leasing: it fills them).

        Only those slots, not every free one: other free slots are filled by a poll, so
        a peer worker polling the same queue gets its turn at the jobs left.
        """
        if acked == 0 or self._stopping.is_set() or not self._lease_lock.acquire(blocking=False):
            return [], 0.0
        try:
            limit = min(acked, self._free_slots() + acked)
            return self._lease_in(tx, limit) if limit > 0 else ([], 0.0)
        finally:
            self._lease_lock.release()

    def _settle_alone(self, batch: Sequence[Ack], failure: Exception) -> None:
        """The group failed and nothing of it committed: settle each ack on its own."""
        if len(batch) > 1:
            log.warning(
                "worker %s: group commit of the acks of jobs %s failed (%s); settling them "
                "one by one",
                self.worker_id,
                [ack.job.id for ack in batch],
                failure,
            )
        # The connection died: the group's COMMIT may have landed before the reply was lost.
        unknown = isinstance(failure, DatabaseUnavailableError)
        for ack in batch:
            with job_fields(ack.job, self.worker_id):
                try:
                    if self._settle(ack.job, ack.write, ack.ctx, outcome_unknown=unknown):
                        ack.committed()
                except JobError as exc:
                    # The store refused one of the job's writes (a version conflict, a stale
                    # fencing token): that attempt fails, classified, like a lone settle's.
                    ack.ctx.discard_writes()
                    self._fail(ack.job, ack.handler, ack.ctx, exc, ack.duration)
                except Exception:
                    log.exception(
                        "worker %s: job %s could not be settled", self.worker_id, ack.job.id
                    )

    def _fail(
        self, job: Job, handler: Handler, ctx: Context, exc: Exception, duration: float
    ) -> None:
        raise NotImplementedError  # Outcomes, the class below this one, defines it
