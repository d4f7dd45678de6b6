"""Bulk actions with filters: requeue or cancel every job a ``JobMatch`` selects.

A bulk action is previewed first (how many, a sample), then applied in batches,
one transaction per batch. Each job's change is conditional on its state (a job
requeued by someone else meanwhile is skipped, not requeued twice), and each
changed job's trace gets the lifecycle event of the change carrying the bulk
action's id, its reason and who ran it, so ``trace show`` answers "why was this
job requeued, and with which others".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from replayq.errors import ConfigurationError
from replayq.model import Job
from replayq.queue import lifecycle
from replayq.runtime import Runtime
from replayq.storage.protocol import JobCancel, JobMatch, JobRequeue, Transaction, iter_chunks

__all__ = ["BULK_ACTIONS", "BulkPreview", "BulkResult", "bulk_apply", "bulk_preview"]

BATCH = 100


@dataclass(frozen=True)
class BulkPreview:
    """What a bulk action would touch: how many jobs, and the first few."""

    matched: int
    sample: list[Job]
    job_ids: list[int]


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did. ``skipped``: matched, but no longer in a state it applies to."""

    action_id: str
    action: str
    reason: str
    changed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def _requeue(tx: Transaction, job_id: int, now: float, hlc: int) -> tuple[bool, str]:
    return tx.job_transition(JobRequeue(job_id, now, hlc)), lifecycle.JOB_REQUEUED


def _cancel(tx: Transaction, job_id: int, now: float, hlc: int) -> tuple[bool, str]:
    return tx.job_transition(JobCancel(job_id, now, hlc)), lifecycle.JOB_CANCELLED


BULK_ACTIONS: dict[str, Callable[[Transaction, int, float, int], tuple[bool, str]]] = {
    "requeue": _requeue,
    "cancel": _cancel,
}


def bulk_preview(runtime: Runtime, match: JobMatch, *, sample: int = 5) -> BulkPreview:
    """The jobs ``match`` selects now (up to ``match.limit``), and the first ``sample``."""
    with runtime.storage.transaction(readonly=True) as tx:
        ids = tx.job_match(match)
        jobs = [job for job in (tx.job_get(i) for i in ids[:sample]) if job is not None]
    return BulkPreview(len(ids), jobs, ids)


def bulk_apply(
    runtime: Runtime,
    action: str,
    match: JobMatch,
    *,
    reason: str,
    by: str,
    job_ids: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> BulkResult:
    """Apply ``action`` (``requeue``: dead → queued; ``cancel``: queued → cancelled) to
    every job ``match`` selects (or exactly ``job_ids``, those of a preview).

    ``progress`` is told how many jobs each committed batch covered.
    """
    if action not in BULK_ACTIONS:
        raise ConfigurationError(f"unknown bulk action {action!r}; use {', '.join(BULK_ACTIONS)}")
    if not reason.strip():
        raise ConfigurationError(f"a bulk {action} needs a reason; it goes into each job's trace")
    change = BULK_ACTIONS[action]
    if job_ids is None:
        job_ids = bulk_preview(runtime, match, sample=0).job_ids
    result = BulkResult(f"bulk-{uuid.uuid4().hex[:12]}", action, reason)
    for batch in iter_chunks(list(job_ids), BATCH):
        with runtime.storage.transaction() as tx:
            for job_id in batch:
                now, hlc = runtime.clock.now(), runtime.hlc.tick()
                changed, event_name = change(tx, job_id, now, hlc)
                job = tx.job_get(job_id) if changed else None
                if job is None:
                    result.skipped.append(job_id)
                    continue
                event = lifecycle.lifecycle(
                    event_name,
                    job,
                    now=now,
                    hlc=hlc,
                    status=job.state.value,
                    reason=reason,
                    by=by,
                    bulk_action=result.action_id,
                )
                tx.trace_append([event])
                result.changed.append(job_id)
        if progress is not None:
            progress(len(batch))
    return result
