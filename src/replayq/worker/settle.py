"""Settling: a job's final write, one compare-and-set transaction, retried while the
database is away and traced as ``write.rejected`` when the lease is gone.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any

from replayq.errors import (
    ConstraintViolationError,
    DatabaseUnavailableError,
    LeaseLostError,
    StatementCancelledError,
    StorageError,
)
from replayq.model import Job
from replayq.queue import lifecycle as trace
from replayq.recording.context import Context
from replayq.storage.protocol import TraceQuery
from replayq.storage.reconnect import Backoff
from replayq.worker.core import WorkerCore

log = logging.getLogger("replayq.worker")

_SETTLE_STORAGE_TRIES = 5


class Settling(WorkerCore):
    """Run a settle's write once, whatever the database does meanwhile."""

    def _settle(
        self, job: Job, write: Any, ctx: Context | None = None, *, ack: bool = False
    ) -> bool:
        """Run ``write(tx)`` in one transaction; a lost lease rolls it all back and is traced.

        On a lost lease the attempt's domain events are still kept (the record of
        what the late worker did), but none of its writes. While the database is
        unreachable the write is retried with backoff: it is a compare-and-set on
        the owner token, so a retry after the lease was reaped is rejected, never
        applied. At the end of the shutdown grace it gives up; the job, still
        ``running``, is reaped after its lease.

        A write refused by a constraint (``ConstraintViolationError``) is not tried
        again: the same write is refused every time. It is raised to the caller (an ack:
        the attempt's failure), unless an earlier try whose reply was lost committed.

        ``ack``: ``write`` commits the handler's writes made outside steps, which the
        server may cancel on every try (a ``ctx.db_write`` slower than the
        ``statement_timeout``): cancelled ``_SETTLE_STORAGE_TRIES`` times, the
        ``StatementCancelledError`` is raised to the caller (who puts the job back), never
        waited out without end with the job's slot and lease held.
        """
        backoff = Backoff(f"worker {self.worker_id}: settle job {job.id}")
        outcome_unknown = False
        failures = 0
        cancelled = 0
        while True:
            try:
                try:
                    flight = self._inflight.get(job.id)
                    with flight.beat if flight is not None else nullcontext():
                        with self.runtime.storage.transaction() as tx:
                            write(tx)
                        if flight is not None and flight.job.owner_token == job.owner_token:
                            # Under ``beat``: a beat after this one would find the lease
                            # gone and trace ``lease.lost`` for a job that settled. (Only
                            # this lease's: a re-lease of the job here is beaten on.)
                            flight.ended = True
                    return True
                except LeaseLostError as exc:
                    if outcome_unknown and self._settled_by_this_attempt(job):
                        return True  # an earlier try committed; only its reply was lost
                    self._reject(job, exc, ctx)
                    return False
            except DatabaseUnavailableError as exc:
                if isinstance(exc, StatementCancelledError) and ack:
                    cancelled += 1
                    if cancelled >= _SETTLE_STORAGE_TRIES:
                        if outcome_unknown and self._settled_by_this_attempt(job):
                            return True  # an earlier try committed; only its reply was lost
                        raise
                outcome_unknown = True  # the connection may have died after COMMIT was sent
                if not backoff.wait(exc, self._force):
                    log.warning(
                        "worker %s: gave up settling job %s at shutdown; it stays running "
                        "and is reaped after its lease",
                        self.worker_id,
                        job.id,
                    )
                    return False
            except ConstraintViolationError:
                if outcome_unknown and self._settled_by_this_attempt(job):
                    return True  # an earlier try committed: its own writes collide now
                raise
            except StorageError as exc:
                # Rolled back for sure (e.g. SQLite's write lock held past busy_timeout):
                # try a few times, then leave the job running to be reaped and re-run.
                failures += 1
                if failures >= _SETTLE_STORAGE_TRIES or not backoff.wait(exc, self._force):
                    log.error(
                        "worker %s: could not settle job %s (%s); it stays running and is "
                        "reaped after its lease",
                        self.worker_id,
                        job.id,
                        exc,
                    )
                    return False

    def _settled_by_this_attempt(self, job: Job) -> bool:
        """Whether this attempt's settle committed: its terminal event is in the trace.

        A settle's state change and its event commit in one transaction, so the
        event (this worker, this attempt) proves the state change landed.
        """
        settled = {trace.JOB_SUCCEEDED, trace.RETRY_SCHEDULED, trace.JOB_DEAD}
        with self.runtime.storage.transaction(readonly=True) as tx:
            return any(
                e.name in settled
                and e.data.get("owner_token") == job.owner_token
                and e.attempt == job.attempt
                for e in tx.trace_query(TraceQuery(job_id=job.id))
            )

    def _reject(self, job: Job, exc: LeaseLostError, ctx: Context | None) -> None:
        """Trace a write refused because the lease is gone, with the attempt's events."""
        now = self.runtime.clock.now()
        flight = self._inflight.get(job.id)
        # The attempt's duration and version count in the observed p99 (contract lint):
        # the runs that outlive their lease are the ones the lease must be sized for.
        duration = time.monotonic() - flight.started if flight is not None else None
        version = ctx.handler.contract.version if ctx is not None else None
        with self.runtime.storage.transaction() as tx:
            if ctx is not None:
                refused = ctx.pending_writes()
                if refused:  # writes made outside steps, refused with the ack
                    ctx.record_fenced(refused, at="ack")
                ctx.discard_writes()
                ctx.flush(tx, failed=True)
            tx.trace_append(
                [
                    trace.lifecycle(
                        trace.WRITE_REJECTED,
                        job,
                        now=now,
                        hlc=self.runtime.hlc.tick(),
                        worker_id=self.worker_id,
                        status="rejected",
                        reason="owner token no longer holds the lease",
                        attempted=str(exc),
                        duration=duration,
                        version=version,
                    )
                ]
            )
        self.stats.rejected += 1
        # Not "another worker's" for sure: a reaper (this worker's own too) may have taken
        # the expired lease back, or the job been cancelled or released, with no one
        # holding it now.
        log.warning(
            "job %s: settle refused: this worker's lease no longer holds (it expired and "
            "was reaped, or the job was taken, cancelled or released meanwhile); "
            "its writes are rejected (write.rejected in its trace)",
            job.id,
        )
