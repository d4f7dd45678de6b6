"""Writes a handler defers to its step's commit: its own tables and child jobs.

``ctx.db_write(fn, key=...)`` and ``ctx.enqueue(job_type, payload, ...)`` record their
event now and run their write in the transaction that commits the step (or the ack);
a replay or fork records the event and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from replayq.queue.enqueue import EnqueueRequest, insert_job
from replayq.recording import callbacks
from replayq.recording.attempt import Attempt
from replayq.storage import packs
from replayq.storage.protocol import IdemClaim, IdemSucceed, Transaction


def defer_db_write(ctx: Attempt, fn: Callable[[Any], Any], key: str | None) -> None:
    """``ctx.db_write``: ``fn(connection)`` at the step's commit, at most once per ``key``."""
    event = ctx.record("db.write", resource=key, key=key)
    if not ctx.world.is_live:
        event.data["replayed"] = True
        return
    job, trace_id, attempt = ctx.job, ctx.trace_id, ctx.attempt

    def write(tx: Transaction) -> None:
        if key is not None:
            claim_token = f"{trace_id}-{attempt}-{event.seq}"
            claim = IdemClaim(key, "db.write", claim_token, event.ts, trace_id, job.id, attempt)
            # What this try finds, not what a try rolled back before it found (a group
            # commit tried again without the ack whose claim of the key it was).
            claimed = tx.idem_transition(claim)
            if claimed == ("deduplicated" in event.data):
                if claimed:
                    del event.data["deduplicated"]
                else:
                    event.data["deduplicated"] = True
                packs.forget(event)
            if not claimed:
                return
        # Inside replayq's commit (at a step's, under ``_live``): a ``ctx`` verb ``fn`` calls
        # is refused in this thread, never left waiting for this very commit (``callbacks``).
        with callbacks.running(ctx, "ctx.db_write"):
            fn(tx.connection)
        if key is not None:
            tx.idem_transition(IdemSucceed(key, claim_token, "null", None, event.ts))

    # Not pipelined (``defer``'s default): ``fn`` may wait inside the transaction, and a
    # PostgreSQL session waiting before a pipeline's Sync is not ended by
    # idle_in_transaction_session_timeout.
    ctx.defer(write, f"db_write {key}" if key else "db_write")


def defer_child_job(
    ctx: Attempt, job_type: str, payload: dict[str, Any], options: Mapping[str, Any]
) -> None:
    """``ctx.enqueue``: the child is inserted in the step's transaction (causation: this job)."""
    request = EnqueueRequest(job_type, payload, **options)
    if job_type in ctx.runtime.registry.job_types():
        handler = ctx.runtime.registry.handler(job_type)
        # A rejected field's value is quoted redacted by the child's rules (its failure's text).
        plain, _ = handler.prepare_payload(request.payload, ctx.runtime.redactor_of(handler))
        request = replace(request, payload=plain)
    origin = ctx.job.origin
    correlation = ctx.job.correlation_id or ctx.job.trace_id
    event = ctx.record("child.enqueued", child_type=job_type, payload=request.payload)

    if not ctx.world.is_live:
        return

    def write(tx: Transaction) -> None:
        child = insert_job(
            ctx.runtime,
            tx,
            request,
            correlation_id=correlation,
            causation_id=str(ctx.job.id),
            origin=origin,
        )
        if event.data.get("child_job_id") != child:
            # Inserted again after a rollback (a new id on PostgreSQL): this try's child.
            event.data["child_job_id"] = child
            packs.forget(event)

    ctx.defer(write, f"child job {job_type}")
