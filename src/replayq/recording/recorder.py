"""What an attempt records before it commits: its pending events, writes and blobs.

``Recorder`` is the part of ``Context`` that builds the attempt's domain events,
holds them with the step's deferred writes until the step (or the ack) commits,
and commits them fenced by the job's lease (``commit_now``). Every value enters
the recording through ``redacted`` / ``encoded`` here. The views' own pending
writes (state, cache) join through three hooks the context fills in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import LeaseLostError, PayloadError
from replayq.model import Job, TraceEvent
from replayq.recording.blobs import Encoded, put_bytes, ref_of
from replayq.redaction import Redactor
from replayq.runtime import Runtime
from replayq.storage.protocol import Transaction


@dataclass
class PendingRecord:
    events: list[TraceEvent] = field(default_factory=list)
    writes: list[Callable[[Transaction], None]] = field(default_factory=list)
    # Large recorded values (blob store rows) go with the events that name them: they do
    # not make a step commit on its own, and a failed step's events keep theirs.
    blobs: list[Callable[[Transaction], None]] = field(default_factory=list)
    # What each write is, for ``write.fenced`` ("state order:1", "outbox orders.paid", ...).
    what: list[str] = field(default_factory=list)


class Recorder:
    """The pending record of one attempt, and its fenced commit (a base of ``Context``)."""

    runtime: Runtime
    job: Job
    worker_id: str
    owner_token: str | None
    redactor: Redactor
    blob_limit: int
    _pending: PendingRecord
    _seq: int
    _trace_id: str
    _steps: list[str]

    @property
    def current_step(self) -> str | None:
        return self._steps[-1] if self._steps else None

    @property
    def owns_job_trace(self) -> bool:
        """Whether this run records into the job's own trace (not a replay, fork or rerun)."""
        return self._trace_id == self.job.trace_id

    def _views_pending(self) -> list[str]:
        """What the views (state, cache) would write at the next commit."""
        return []

    def _views_committed(self) -> None:
        """The views' pending writes committed."""

    def _views_discard(self) -> None:
        """A step failed: the views drop their pending writes."""

    # -- recording --------------------------------------------------------------------------

    def event(
        self,
        name: str,
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        hlc: int | None = None,
        **data: Any,
    ) -> TraceEvent:
        """Build the next domain event of this attempt (sequence numbered)."""
        self._seq += 1
        return TraceEvent.of(
            {
                "trace_id": self._trace_id,
                # A derived trace (replay, fork) is not part of the job's own timeline.
                "job_id": self.job.id if self.owns_job_trace else None,
                "attempt": self.job.attempt,
                "kind": "domain",
                "name": name,
                "seq": self._seq,
                "step": self.current_step,
                "ts": self.runtime.clock.now(),
                "hlc": hlc if hlc is not None else self.runtime.hlc.tick(),
                "worker_id": self.worker_id,
                "status": status,
                "resource": resource,
                "resource_version": resource_version,
                "side_effect": side_effect,
                "input_ref": None,
                "output_ref": output_ref,
                "data": self.redacted(data),
                "id": None,
            }
        )

    def record(self, name: str, **kwargs: Any) -> TraceEvent:
        """Record a domain event; it commits with the step (or the ack)."""
        event = self.event(name, **kwargs)
        self._pending.events.append(event)
        return event

    def defer(self, write: Callable[[Transaction], None], what: str = "write") -> None:
        """Run ``write(tx)`` in the transaction that commits the current step.

        ``what`` names the write in ``write.fenced`` should the lease be gone by then.
        """
        self._pending.writes.append(write)
        self._pending.what.append(what)

    # -- fencing ----------------------------------------------------------------------------

    def lease_held(self, tx: Transaction) -> bool:
        """Whether this context's owner token still holds the job's lease, inside ``tx``.

        Contexts without an owner token (replays, reruns) hold no lease and are not
        fenced by one. On PostgreSQL the job row stays locked until ``tx`` ends.
        """
        if self.owner_token is None:
            return True
        return tx.lease_check(self.job.id, self.owner_token)

    def fence(self, tx: Transaction, refused: list[str], **details: Any) -> None:
        """Raise ``LeaseLostError`` in ``tx`` unless the lease is held; the refusal is traced.

        The ``write.fenced`` event waits with the attempt's other events (``tx`` is
        about to roll back) and commits with the attempt's failure or rejection.
        """
        if self.lease_held(tx):
            return
        self.record_fenced(refused, **details)
        raise LeaseLostError(
            f"job {self.job.id} attempt {self.job.attempt}: the lease was taken by another "
            f"worker; refused: {', '.join(refused)}"
        )

    def record_fenced(self, refused: list[str], **details: Any) -> TraceEvent:
        """Record ``write.fenced``: what the database refused because the lease is gone."""
        return self.record(
            "write.fenced",
            status="rejected",
            refused=refused,
            reason="owner token no longer holds the job's lease",
            owner_token=self.owner_token,
            **details,
        )

    def ride_along(self) -> list[TraceEvent]:
        """Pending events that may commit in a transaction the attempt opens now (an
        effect's claim or result), so that they need no commit of their own. None while
        a write is pending: a step's events commit with that step's writes."""
        pending = self._pending
        return [] if pending.blobs or self.pending_writes() else list(pending.events)

    def rode(self, events: list[TraceEvent]) -> None:
        """``events`` (from ``ride_along``) committed: they are no longer pending."""
        if events:
            gone = {id(e) for e in events}
            self._pending.events = [e for e in self._pending.events if id(e) not in gone]

    def pending_writes(self) -> list[str]:
        """What the next commit would write (for ``write.fenced``)."""
        return [*self._pending.what, *self._views_pending()]

    def redacted(self, value: Any) -> Any:
        """``value`` with its secrets replaced by markers (``replayq.redaction``).

        The one boundary where values enter the recording: every event's data and
        every encoded value (blobs, effect results, step results) pass through here.
        """
        return self.redactor.value(value)

    def encode(self, value: Any, *, what: str) -> tuple[Any, str | None, bytes | None]:
        """Check a recorded value: JSON only, under the blob limit; large ones go to blobs."""
        inline, ref, raw, _ = self.encoded(value, what=what)
        return inline, ref, raw

    def encoded(self, value: Any, *, what: str) -> Encoded:
        """``encode``, keeping the canonical text: the value is walked and serialised once
        here; the size check, the version row, the blob and its hash reuse the text."""
        try:
            value, text = self.redactor.encoded(value, lambda v: codec.dumps(v, what=what))
        except PayloadError as exc:
            raise PayloadError(f"{what} cannot be recorded: {exc}") from exc
        raw = text.encode()
        size = len(raw)
        if size > self.blob_limit:
            raise PayloadError(
                f"{what}: {size} bytes is above the blob limit of {self.blob_limit} bytes"
            )
        if size <= self.runtime.limits.inline_limit_bytes:
            return Encoded(value, None, None, text)
        return Encoded(None, ref_of(raw), raw, text)

    def store_blob(self, raw: bytes | None, what: str, ref: str | None = None) -> None:
        """Schedule a large value for the blob store: it commits with the events (the next
        commit of the attempt, whether or not the step's writes commit)."""
        if raw is None:
            return
        now = self.runtime.clock.now()
        limit = self.blob_limit

        def write(tx: Transaction) -> None:
            put_bytes(tx, raw, now=now, limit=limit, what=what, ref=ref)

        self._pending.blobs.append(write)

    def flush(self, tx: Transaction, *, failed: bool = False) -> None:
        """Write what is pending into ``tx``: events and their blobs always; writes unless
        the attempt failed."""
        for blob in self._pending.blobs:
            blob(tx)
        if not failed:
            for write in self._pending.writes:
                write(tx)
        tx.trace_append(self._pending.events)

    def pending_write_calls(self) -> list[Callable[[Transaction], None]]:
        """The writes the next commit would run, in order."""
        return [*self._pending.blobs, *self._pending.writes]

    def take_pending(self, *, failed: bool = False) -> tuple[list[Any], list[TraceEvent]]:
        """Hand over what is pending — writes (none if ``failed``) and events — instead of
        committing it now; for a caller that commits them later (a dry-run)."""
        pending = self._pending
        self.committed()
        return [*pending.blobs, *([] if failed else pending.writes)], pending.events

    def committed(self) -> None:
        """The transaction that ``flush`` wrote into has committed: forget what it held."""
        self._pending = PendingRecord()
        self._views_committed()

    def discard_writes(self) -> None:
        """A step failed: its writes never happen; its events are kept for the record."""
        self._pending.writes.clear()
        self._pending.what.clear()
        self._views_discard()

    def commit_now(self, *, failed: bool = False) -> None:
        """Commit what is pending in a transaction of its own (a step boundary).

        The writes commit only if this context's owner token still holds the job's
        lease, checked in the database in the same transaction (``lease_check``): once
        another worker took the job they are refused (``LeaseLostError``, traced as
        ``write.fenced``); the attempt's events are still kept. The lease is checked
        (and on PostgreSQL the job row locked) before the writes, and the refusal
        raised after the writes' own checks, so a write under a re-acquired lock is
        also traced as refused by the lock (``state.write_rejected``); everything
        rolls back, and without the lease the error is always ``LeaseLostError``.
        """
        refused = self.pending_writes() if not failed else []
        with self.runtime.storage.transaction() as tx:
            held = not refused or self.lease_held(tx)
            lost = LeaseLostError(
                f"job {self.job.id} attempt {self.job.attempt}: the lease was taken by "
                f"another worker; not committed: {', '.join(refused)}"
            )
            try:
                self.flush(tx, failed=failed)
            except Exception as exc:
                # A write's own check refused it too (a version conflict, a stale lock
                # token; its event is recorded): without the lease, the lease is the reason.
                if held:
                    raise
                raise lost from exc
            if not held:
                raise lost
        self.committed()
