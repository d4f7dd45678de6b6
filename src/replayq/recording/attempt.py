"""The port the context's views are written against: one job attempt being recorded.

``state``, ``locks``, ``effects``, ``cache`` and ``outbox`` each take an
``Attempt`` — the parts of ``Context`` they use — so they import this small
protocol and never the context itself (the context builds them on first use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from replayq.errors import ContextEndedError
from replayq.model import Job, TraceEvent
from replayq.queue.handlers import Handler
from replayq.recording.blobs import Encoded
from replayq.recording.callbacks import Callback
from replayq.recording.world import LostFlag, World
from replayq.redaction import Redactor
from replayq.runtime import Runtime
from replayq.storage.protocol import TraceFence, Transaction

log = logging.getLogger("replayq.recording")

# The mark of an ended attempt: what ``Context.end`` puts in place of its cancel flag. Always
# set, so every cancel point (``check_cancelled``) is reached and says the attempt ended; a
# view's entry point compares the flag with it (``ctx._cancel is ENDED``: ~40 instructions,
# where a method call to ask would cost ~440).
ENDED = LostFlag()
ENDED.set()


def ended_late(ctx: Attempt, verb: str, outcome: str, kept: str) -> ContextEndedError:
    """A verb (``ctx.call('x')``...) whose outside work ended (``outcome``) after its
    attempt did: logged, since the attempt's trace takes nothing after its end (``kept``:
    what became of it), and the error its caller gets."""
    log.warning(
        "job %s attempt %s: %s %s after the attempt ended (the handler had returned); %s",
        ctx.job.id,
        ctx.attempt,
        verb,
        outcome,
        kept,
    )
    return ended_error(ctx.job.id, ctx.attempt)


def ended_error(job_id: int, attempt: int) -> ContextEndedError:
    """The error a use of a context (``Context``, its views, a quick dry-run's) after its
    attempt ended raises."""
    return ContextEndedError(
        f"this Context's attempt (job {job_id}, attempt {attempt}) has ended; "
        "a ctx is good only during the handler call it was passed to, and code that "
        "kept it (a thread, a closure called later) would record into an attempt that "
        "never commits again: finish that work before the handler returns, or enqueue "
        "a job for it"
    )


class Refusal:
    """A deferred write that only refuses (raises) and needs no transaction.

    A replay that must reject a write where the recording's commit was rejected
    defers one of these: a context that commits later (a dry-run) still raises it at
    the step's commit, where the recorded attempt's commit failed.
    """

    def __init__(self, refuse: Callable[[], None]) -> None:
        self.refuse = refuse

    def __call__(self, tx: Transaction | None) -> None:
        self.refuse()


class Attempt(Protocol):
    """One attempt of a job as its recording views see it."""

    runtime: Runtime
    job: Job
    handler: Handler
    world: World
    worker_id: str
    branch: str
    branch_base: tuple[str, int] | None
    namespace: str
    redactor: Redactor
    # The attempt's cancel flag, ``ENDED`` once it ended (``Context.end``): each view's
    # entry point refuses then, as the context's own verbs do.
    _cancel: LostFlag | None
    # Held by ``Context.end`` as it sets ``ENDED``: a verb whose outside call may outlive
    # the handler (``ctx.call``, ``ctx.effect``) holds it from its look at ``_cancel`` to
    # the end of what it records, so nothing is recorded into the trace after the end.
    _live: Any  # a ``threading.Lock``
    # Held while the attempt's pending writes change, and by a commit from its flush to its
    # ``committed`` (``Recorder._pending_lock``): a view's own pending list that the commit
    # empties (the cache's after-commit actions) changes under it too.
    _pending_lock: Any  # a ``threading.RLock``
    # Set while a ``ctx.db_write`` function runs inside a commit of this attempt: each view's
    # entry point refuses in its thread (``_refuse_inside``).
    _callback: Callback | None

    def _refuse_inside(self, verb: str) -> None:
        """``CallbackReentryError`` naming ``verb`` if this thread runs a callback of the
        attempt (asked where ``_callback`` is set: ``recording.callbacks``)."""
        ...

    def _hold_pending(self) -> Any:
        """``_pending_lock`` taken for a verb's event and write to join the pending record
        under one hold, returned held (the caller releases it); ``ContextEndedError`` once
        the attempt ended (``Context._hold_pending``)."""
        ...

    def _hold_read(self) -> Any:
        """``_end_lock`` taken for a read's events, returned held; ``ContextEndedError``
        once the attempt ended (``Context._hold_read``)."""
        ...

    @property
    def trace_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def current_step_key(self) -> str | None:
        """The position of the innermost step running in this flow (thread, task):
        ``load``, ``load#2``, if any."""
        ...

    @property
    def _outbox_step_key(self) -> str | None:
        """The step position an outbox event published now is numbered under: as
        ``current_step_key``, or in a thread or task a step started, that step's."""
        ...

    def event(self, name: str, **fields: Any) -> TraceEvent:
        """Build the next domain event of this attempt (not yet recorded)."""
        ...

    def record(self, name: str, **fields: Any) -> TraceEvent:
        """Record a domain event; it commits with the step (or the ack)."""
        ...

    def unmake(self, event: TraceEvent) -> None:
        """``event`` (the last ``event`` built) dropped unrecorded: its sequence number is
        the next event's again."""
        ...

    def record_read(self, resource: str, version: int, exists: bool, branch: str) -> TraceEvent:
        """Record ``state.read`` of ``resource`` at ``version`` on ``branch``."""
        ...

    def record_screened(
        self,
        name: str,
        screened: tuple[str, ...],
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        output_ref: str | None = None,
        **data: Any,
    ) -> TraceEvent:
        """``record`` where the fields named in ``screened`` are redacted already."""
        ...

    def event_screened(
        self,
        name: str,
        screened: tuple[str, ...],
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        **data: Any,
    ) -> TraceEvent:
        """``event`` where the fields named in ``screened`` are redacted already."""
        ...

    def defer(
        self, write: Callable[[Transaction], None], what: str = "write", *, pipelines: bool = False
    ) -> None:
        """Run ``write(tx)`` in the transaction that commits the current step (named ``what``;
        ``pipelines=True``: ``write`` runs replayq's own verbs alone, and that commit may be
        pipelined)."""
        ...

    def defer_release(self, release: Callable[[Transaction], None]) -> None:
        """Run ``release(tx)`` (a lock's release) in the attempt's next commit, after its
        writes, whether or not they are written."""
        ...

    def fenced_by(self, resource: str, fencing_token: int) -> bool:
        """Whether a pending write carries ``fencing_token`` of the lock on ``resource``."""
        ...

    def _in_step(self) -> bool:
        """Whether a step runs in this flow (``Recorder._in_step``)."""
        ...

    def _defer_after_commit(self, action: Callable[[], None], what: str) -> bool:
        """Hold ``action`` for the end of the step running in this thread or task."""
        ...

    def _fenced_in_step(self, resource: str, fencing_token: int) -> bool:
        """Whether such a write waits in a step still running (in any thread or task)."""
        ...

    def amend(self, event: TraceEvent, amended: TraceEvent) -> None:
        """The pending ``event`` replaced by ``amended``, in its place in the sequence."""
        ...

    def trace_fence(self) -> TraceFence | None:
        """The lease this attempt's writes are fenced by (``None`` without an owner token)."""
        ...

    def refuse(self, refused: list[str], **details: Any) -> NoReturn:
        """Trace ``write.fenced`` and raise ``LeaseLostError``: the lease is gone."""
        ...

    def fence(self, tx: Transaction, refused: list[str], **details: Any) -> None:
        """Raise ``LeaseLostError`` (traced ``write.fenced``) unless the job's lease is held."""
        ...

    def append_fenced(
        self, tx: Transaction, events: list[TraceEvent], refused: list[str], **details: Any
    ) -> None:
        """Append ``events`` in ``tx`` as ``fence`` would guard its writes: the append is the
        lease check; without the lease nothing is appended and ``LeaseLostError`` raised."""
        ...

    def encode(self, value: Any, *, what: str) -> tuple[Any, str | None, bytes | None]:
        """Check a value for recording: ``(inline value, blob ref, blob bytes)``."""
        ...

    def ride_along(self) -> list[TraceEvent]:
        """Pending events that may commit in a transaction opened now (none if writes wait)."""
        ...

    def rode(self, events: list[TraceEvent]) -> None:
        """The events ``ride_along`` returned committed."""
        ...

    def encoded(self, value: Any, *, what: str) -> Encoded:
        """``encode`` keeping the text (serialised once, reused for rows and hashes)."""
        ...

    def encoded_as_written(self, value: Any, *, what: str) -> tuple[Encoded, Encoded]:
        """``encoded`` and the value as written (once, if redaction changed nothing)."""
        ...

    def store_blob(self, raw: bytes | None, what: str, ref: str | None = None) -> None: ...

    def fences(self) -> dict[str, int]:
        """The fencing token of every lock this attempt holds, by resource."""
        ...
