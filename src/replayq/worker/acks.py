"""Acking: the successes of several jobs commit together (group commit).

An executor whose job succeeded hands its ack over. When the ack may wait (nothing
of the attempt's own is pending but its events; no lock, no shadow run, no observer
following the attempt) and a leased-ahead job is at hand, the executor starts that
job at once and the ack gathers with others. An executor with nothing else to run
commits what has gathered, its own ack with it, on its own thread (the leader of
the group: no hand-off) unless a commit is under way, whose thread then takes the
next group. The acker thread commits acks no executor waits for when they fill
the worker's capacity or ``ack_window`` seconds after the first of them.

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
    """Gather acks and commit them in groups (led by a waiting executor, or the acker)."""

    def _ack(self, ack: Ack, *, wait: bool, refill: bool) -> None:
        """Hand ``ack`` over for the next group; with ``wait``, return once it is settled.

        A caller that waits commits the group itself when no commit is under way (no
        thread hand-off: the leader of a group commit); else the committing thread
        takes it with the next group. Without the acker (``execute()`` outside
        ``run()``) it commits here, on its own, leasing the slot it frees only with
        ``refill``.
        """
        if not self._acker_running:
            self._settle_acks([ack], refill=refill, forget=False)  # the caller frees the slot
            return
        with self._acks_wake:
            self._acks.append(ack)
            if not wait:
                if len(self._acks) >= self.capacity:
                    self._acks_flush = True
                    self._acks_wake.notify_all()
                elif len(self._acks) == 1:
                    self._acks_wake.notify_all()  # the acker times the window from now
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
                # Wake only a thread with something to do: a waiting executor, or the
                # acker when acks gathered meanwhile (a wake-up costs more than the SQL).
                if self._acks_waiters or self._acks:
                    self._acks_wake.notify_all()

    def _stop_acker(self) -> None:
        with self._acks_wake:
            self._acks_stop = True
            self._acks_wake.notify_all()

    def _acker(self) -> None:
        """The acker thread: commit acks no executor waits for, once their window ends
        (or at once when asked, or when they fill the worker's capacity), until stopped."""
        while True:
            with self._acks_wake:
                while (not self._acks or self._acks_committing) and not self._acks_stop:
                    self._acks_wake.wait()
                if self._acks_stop and not self._acks and not self._acks_committing:
                    return
                if self._acks_committing:
                    self._acks_wake.wait(0.05)  # stopping: the leader is still committing
                    continue
                deadline = self._acks[0].queued + self.ack_window
                while self._acks and not (self._acks_flush or self._acks_stop):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._acks_wake.wait(remaining)
                if self._acks_committing or not self._acks:
                    continue  # an executor took them
                batch = self._take_acks()
            self._commit_taken(batch)

    def _settle_acks(self, batch: Sequence[Ack], *, refill: bool, forget: bool = True) -> None:
        """Commit ``batch`` and (with ``forget``) free its slots, whatever happens."""
        try:
            self._commit_acks(batch, refill, forget)
        except Exception:  # never let the acker die: the jobs are reaped after their lease
            log.exception("worker %s: acks could not be settled", self.worker_id)
        finally:
            for ack in batch:
                if forget:
                    self._forget(ack.job)
                ack.done.set()

    def _commit_acks(self, batch: Sequence[Ack], refill: bool, forget: bool) -> None:
        """One transaction for ``batch``: every ack whose lease holds, and the refill."""
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
            self._settle_alone(batch, failure)
            return
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
