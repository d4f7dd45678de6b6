"""The reaper: jobs whose lease expired are re-delivered, buried, or cancelled."""

from __future__ import annotations

import logging

from replayq.model import DeadReason
from replayq.queue import lifecycle as trace
from replayq.storage.params import LeasesExpired
from replayq.storage.protocol import JobBury, JobRedeliver
from replayq.worker.outcome import Outcomes

log = logging.getLogger("replayq.worker")


class Reaping(Outcomes):
    """Take back the jobs of workers that died or stalled past their lease."""

    def reap(self) -> int:
        """Re-queue jobs whose lease expired (counted as re-deliveries); bury exhausted ones."""
        now = self.runtime.clock.now()
        count = 0
        with self.runtime.storage.transaction() as tx:
            for job in tx.job_list(
                LeasesExpired(now, 100, database_clock=self.runtime.leases_by_database)
            ):
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
        self.stats.redelivered += count
        return count
