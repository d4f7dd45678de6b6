"""The ``App``'s methods that inspect jobs and act on them, over a ``Runtime``.

``App`` inherits ``JobsFacade``; the methods stay the public API there
(``app.list_jobs``, ``app.cancel``, ``app.bulk``…). Here they only need the
runtime the app composed, so they live in the layer whose functions they call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from msgspec import structs

from replayq.model import Job, StatRow, TraceEvent
from replayq.queue.actions import cancel_job, requeue_job
from replayq.queue.enqueue import get_job
from replayq.queue.resources import resource_trace
from replayq.runtime import Runtime
from replayq.storage.protocol import JobFilter, JobMatch, TraceQuery
from replayq.storage.reports import JobCount, JobGauges, JobStats

if TYPE_CHECKING:
    # Imported by the two bulk methods when called: a worker runs neither.
    from replayq.queue.bulk import BulkPreview, BulkResult


def os_user() -> str:
    """Who is at the keyboard, for the ``by`` of a resolution (``$USER`` or the login name)."""
    import getpass  # here: a worker never resolves an effect, and its start paid for it

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers) and no $USER
        return "unknown"


class JobsFacade:
    """Reading jobs, their traces and counts; cancelling, requeueing, bulk actions."""

    runtime: Runtime

    def get_job(self, job_id: int) -> Job:
        return get_job(self.runtime, job_id)

    def get_job_or_none(self, job_id: int) -> Job | None:
        """The job, or ``None`` if there is no job ``job_id``."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return tx.job_get(job_id)

    def list_jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        job_type: str | None = None,
        origin: str | None = "production",
        limit: int = 100,
        version: str | None = None,
        before: int | None = None,
    ) -> list[Job]:
        """Jobs, newest first; ``version``: only those routed to that handler version;
        ``before``: only ids below it (the next page starts below the last id shown)."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return tx.job_list(JobFilter(states, job_type, origin, limit, version, before))

    def count_jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        job_type: str | None = None,
        origin: str | None = "production",
        version: str | None = None,
    ) -> int:
        """How many jobs ``list_jobs`` with the same filters pages through."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return tx.report(JobCount(JobFilter(states, job_type, origin, version=version)))

    def stats(self) -> list[StatRow]:
        """Production jobs counted by type and state, with the oldest ``run_at`` of each."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return tx.report(JobStats())

    def queue_overview(self) -> list[dict[str, Any]]:
        """Open jobs by queue, type, version and state, with the oldest ready job's ``run_at``
        (``oldest_ready``) and the oldest running lease (``oldest_leased``)."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return [structs.asdict(row) for row in tx.report(JobGauges(self.runtime.clock.now()))]

    def trace(self, job_id: int) -> list[TraceEvent]:
        """Every event of a job, ordered by the hybrid logical clock."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            return tx.trace_query(TraceQuery(job_id=job_id))

    def resource_trace(
        self, resource: str, *, leases: bool = False, all_origins: bool = False
    ) -> list[TraceEvent]:
        """Every event touching one resource, across jobs and workers, in HLC order.

        A versioned key's events (a cache entry ``price:sku-1:v3``) are found from
        its base resource (``price:sku-1``). Only production traces are shown:
        replay, fork and rerun traces are kept out unless ``all_origins``. With
        ``leases`` the lease transitions of the jobs that touched the resource are
        merged in (leased, lease expired, re-delivered, settled, write rejected):
        which worker held which job between its reads and writes of the resource.

        A trace stores each resource redacted (docs/secrets.md): ``resource`` is
        redacted by the app's and each job type's rules before it is looked up, so
        ``card:4111…`` and ``card:[redacted:…]`` find the same events; two ids that
        redact alike share one timeline.
        """
        return resource_trace(self.runtime, resource, leases=leases, all_origins=all_origins)

    def cancel(self, job_id: int) -> bool:
        """Cancel a queued job, or ask a running one to stop; ``False`` if it is neither.

        A running job stops at its handler's next step boundary or ``ctx`` call
        (``JobCancelledError``; ``ctx.cancelled`` reads it), once its worker's heartbeat
        has seen the request: the attempt ends ``cancelled`` with the steps it committed.
        Its lease is no longer extended, so a handler that reaches no boundary within
        the lease is cancelled by the reaper and its late writes are refused.
        """
        return cancel_job(self.runtime, job_id)

    def bulk_preview(self, match: JobMatch, *, sample: int = 5) -> BulkPreview:
        """How many jobs a bulk action with these filters would touch, and a sample."""
        from replayq.queue.bulk import bulk_preview

        return bulk_preview(self.runtime, match, sample=sample)

    def bulk(
        self,
        action: str,
        match: JobMatch,
        *,
        reason: str,
        by: str | None = None,
        job_ids: Sequence[int] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BulkResult:
        """``requeue`` (dead jobs) or ``cancel`` (queued jobs) every job ``match`` selects.

        Give ``job_ids`` (a preview's) to act on exactly what was previewed. Each changed
        job's trace records the action's id (``bulk_action``), ``reason`` and ``by``
        (default: the OS user); jobs no longer in a state the action applies to are
        skipped. ``progress`` is told the size of each committed batch.
        """
        from replayq.queue.bulk import bulk_apply

        return bulk_apply(
            self.runtime,
            action,
            match,
            reason=reason,
            by=by or os_user(),
            job_ids=job_ids,
            progress=progress,
        )

    def requeue(self, job_id: int, *, reason: str, to_version: str | None = None) -> bool:
        """Move a dead job back to the queue with one more attempt; the reason is traced.

        The job runs under ``to_version`` (which must be declared here if this app
        declares the type), or is routed afresh at its next lease.
        """
        return requeue_job(self.runtime, job_id, reason=reason, to_version=to_version)
