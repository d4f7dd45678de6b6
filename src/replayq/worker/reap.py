"""The reaper: jobs whose lease expired are re-delivered, buried, or cancelled."""

from __future__ import annotations

import logging
from collections.abc import Callable

from replayq.errors import (
    ConstraintViolationError,
    LeaseLostError,
    internal_error_message,
    internal_violation,
)
from replayq.model import DeadReason, Job
from replayq.queue import lifecycle as trace
from replayq.storage.params import LeasesExpired
from replayq.storage.protocol import JobBury, JobRedeliver, Transaction
from replayq.worker.outcome import Outcomes, Parking

log = logging.getLogger("replayq.worker")


class Reaping(Outcomes):
    """Take back the jobs of workers that died or stalled past their lease."""

    def reap(self) -> int:
        """Re-queue jobs whose lease expired (counted as re-deliveries); bury exhausted ones.

        A job whose write a constraint of replayq's own tables refuses (``internal``: a
        bug of replayq's) would roll back the whole pass, and the same pass again each
        time: it is parked ``dead`` / ``internal_error`` on its own (``_park_unreapable``)
        and the pass done again without it; if even that is refused, it is skipped by
        this worker from then on (logged as an error), left ``running``."""
        count = 0
        while True:
            current: list[Job] = []
            try:
                count += self._reap_pass(current)
                break
            except ConstraintViolationError as refused:
                violation = internal_violation(refused)
                if violation is None or not current:
                    raise
                count += self._park_unreapable(current[0], violation)
        self.stats.redelivered += count
        return count

    def _reap_pass(self, current: list[Job]) -> int:
        """One transaction reaping the expired jobs not skipped; ``current`` holds the job
        being written while a write is under way (the one a refusal is of)."""
        now = self.runtime.clock.now()
        count = 0
        with self.runtime.storage.transaction() as tx:
            for job in tx.job_list(
                LeasesExpired(now, 100, database_clock=self.runtime.leases_by_database)
            ):
                if (job.id, job.owner_token) in self._unreapable:
                    continue
                current[:] = [job]
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
                    why = "the lease ran out before a step boundary"
                    if self._stop(tx, job, now, hlc, why, also=[expired]):
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
            current.clear()  # a refusal at commit is of none of them in particular
        return count

    def _park_unreapable(self, job: Job, violation: ConstraintViolationError) -> int:
        """Park ``job``, whose reaping a constraint of replayq's own tables refused, as
        ``dead`` / ``internal_error``, by ``Outcomes._park``'s minimal write: its ``job.dead``
        event with it, or, if that too is refused, the job row alone; 1 if parked. If
        even its move to ``dead`` is refused (or it is not ours to park any more), this
        worker skips it from then on, logged as an error: it stays ``running``."""
        assert job.owner_token is not None
        base = (
            f"{internal_error_message(violation)}; reaping the job (its lease expired) was refused"
        )
        messages = (
            self.runtime.redactor.text(f"{base}, parked"),
            self.runtime.redactor.text(f"{base}, parked without job.dead"),
        )
        if self._park_internal(job, messages, self._write_plain, "could not be reaped") is (
            Parking.PARKED
        ):
            return 1
        self._unreapable.add((job.id, job.owner_token))
        log.error(
            "worker %s: job %s could not be reaped: replayq's own tables refused it (%s); "
            "this worker skips it from now on, it stays running",
            self.worker_id,
            job.id,
            violation,
        )
        return 0

    def _write_plain(self, write: Callable[[Transaction], None]) -> bool:
        """``write(tx)`` in one plain transaction (no retry: the next pass tries again);
        ``False`` if the lease is not the reaped one's any more (reaped or settled by
        another meanwhile: not ours to park)."""
        try:
            with self.runtime.storage.transaction() as tx:
                write(tx)
        except LeaseLostError:
            return False
        return True
