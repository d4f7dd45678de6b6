"""The recording context: a handler's only door to the world.

Everything that passes through ``ctx`` is recorded as a domain event in the
job's trace. Events and state writes wait in the context until the step that
made them commits (``with ctx.step(...)`` or ``ctx.step(name, fn)``) or, outside
steps, until the job is acked: the step's state writes, outbox rows, child jobs and
events commit in one transaction. Two things commit at once because other workers
must see them: lock acquisition/release and idempotency records around effects.

Fencing: a worker's context carries the job's ``owner_token``. Every transaction
that writes for the job — a step's commit, an effect's claim and its result, a
lock's acquisition — asks the database whether that token still holds the job's
lease: the statement that appends the transaction's events checks it
(``trace_append`` with a ``TraceFence``), or ``tx.lease_check`` where no event is
appended. Once the lease was taken by another worker the
write is refused with ``LeaseLostError``, nothing of it commits, and the trace
records ``write.fenced`` naming what was refused. Contexts without a lease
(replays, forks, guarded reruns) have no owner token and are not fenced by one.

Every read of the outside world goes through the context's ``World``
(``replayq.recording.world``): live for workers; recorded, gated or stubbed
for the replay engine. The context never asks which world it is in.
"""

from __future__ import annotations

import asyncio
import random as _random
import uuid as _uuid
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn, TypeVar, overload

from replayq import codec
from replayq.errors import (
    JobCancelledError,
    LeaseLostError,
    PayloadError,
)
from replayq.model import Job, TraceEvent
from replayq.queue.contracts import render_template
from replayq.queue.handlers import Handler
from replayq.recording.aio import run_flow
from replayq.recording.blobs import Encoded, put_bytes, ref_of
from replayq.recording.cache import CacheView
from replayq.recording.calls import record_call
from replayq.recording.effects import EffectRunner
from replayq.recording.ledger import step_key
from replayq.recording.locks import LockHandle, LockManager
from replayq.recording.outbox import OutboxView
from replayq.recording.state import StateView
from replayq.recording.steps import run_step, step_boundary
from replayq.recording.world import LIVE, LiveWorld, LostFlag, World
from replayq.recording.writes import defer_child_job, defer_db_write
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import TraceFence, Transaction

T = TypeVar("T")


@dataclass
class _Pending:
    events: list[TraceEvent] = field(default_factory=list)
    writes: list[Callable[[Transaction], None]] = field(default_factory=list)
    # Large recorded values (blob store rows) go with the events that name them: they do
    # not make a step commit on its own, and a failed step's events keep theirs.
    blobs: list[Callable[[Transaction], None]] = field(default_factory=list)
    # What each write is, for ``write.fenced`` ("state order:1", "outbox orders.paid", ...).
    what: list[str] = field(default_factory=list)


class Context:
    """What a handler receives as its first argument."""

    def __init__(
        self,
        source: RuntimeSource,
        job: Job,
        handler: Handler,
        *,
        worker_id: str,
        world: World | None = None,
        branch: str = "main",
        trace_id: str | None = None,
        namespace: str = "",
        owner_token: str | None = None,
        cancel: LostFlag | None = None,
        branch_base: tuple[str, int] | None = None,
    ) -> None:
        runtime = source.runtime
        self.runtime = runtime
        self.job = job
        self.handler = handler
        self.worker_id = worker_id
        self.branch = branch
        # (base branch, base HLC) of a branch whose row is not written yet: reads go through
        # to it as they would through the row (a dry-run writes its branch at the end).
        self.branch_base = branch_base
        self.world: World = world or LiveWorld()
        self.namespace = namespace
        self.owner_token = owner_token
        # Set by the worker's heartbeat once the running job was asked to stop.
        self._cancel = cancel
        self._trace_id = trace_id or job.trace_id
        self._pending = _Pending()
        self._seq = 0
        self._steps: list[str] = []
        self._step_keys: list[str] = []
        self._step_counts: dict[str, int] = {}
        self.blob_limit = runtime.limits.blob_limit_bytes
        # Applied to every value before it enters the recording (``redacted``).
        self.redactor = handler.redactor or runtime.redactor

    # -- views, built on first use (most handlers touch few of them, many touch none) -------

    @cached_property
    def locks(self) -> LockManager:
        return LockManager(self)

    @cached_property
    def state(self) -> StateView:
        return StateView(self)

    @cached_property
    def cache(self) -> CacheView:
        return CacheView(self)

    @cached_property
    def outbox(self) -> OutboxView:
        return OutboxView(self)

    @cached_property
    def effects(self) -> EffectRunner:
        return EffectRunner(self)

    def fences(self) -> dict[str, int]:
        """The fencing token of every lock this attempt holds, by resource."""
        return self.locks.fences() if self._built("locks") else {}

    def _built(self, view: str) -> bool:
        """Whether the view ``view`` was used (built) in this attempt."""
        return view in self.__dict__

    # -- identity ---------------------------------------------------------------------------

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def trace_id(self) -> str:
        return self._trace_id

    @property
    def version(self) -> str:
        return self.handler.contract.version

    @property
    def payload(self) -> dict[str, Any]:
        return self.job.payload

    @property
    def current_step(self) -> str | None:
        return self._steps[-1] if self._steps else None

    @property
    def current_step_key(self) -> str | None:
        """The position of the innermost running step (``load``, ``load#2``), if any."""
        return self._step_keys[-1] if self._step_keys else None

    @property
    def owns_job_trace(self) -> bool:
        """Whether this run records into the job's own trace (not a replay, fork or rerun)."""
        return self._trace_id == self.job.trace_id

    @property
    def cancelled(self) -> bool:
        """True once the job was asked to stop (``replayq jobs cancel``) while it ran.

        A handler in a long loop can check it and return; otherwise its next step
        boundary or ``ctx`` call raises ``JobCancelledError``. The worker notices a
        cancel at its next heartbeat.
        """
        return self._cancel is not None and self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Raise ``JobCancelledError`` if the job was asked to stop (a cancel point)."""
        if self.cancelled:
            raise JobCancelledError(
                f"job {self.job.id} attempt {self.attempt} was asked to stop; "
                f"it stops before {self.current_step or 'its next step'}"
            )

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found this worker no longer holds the job's lease."""
        return self.world.lease_lost()

    # -- running ----------------------------------------------------------------------------

    def run(self, run_coroutine: Callable[[Coroutine[Any, Any, Any]], Any] | None = None) -> Any:
        """Call the handler with the job's payload, inside the contract's lock if it has one.

        An ``async def`` handler's coroutine is handed to ``run_coroutine`` (a worker's
        one event loop, shared by its async jobs) or, without one, run on a new loop.
        """
        handler, payload = self.handler, self.job.payload
        resource = render_template(handler.contract.lock, payload)
        # Typed fields (Decimal, datetime, a dataclass...) from their stored JSON form.
        args = handler.shape.decode(handler.contract.name, payload)

        def call() -> Any:
            if isinstance(args, tuple):
                result = handler.fn(self, *args)
            else:
                result = handler.fn(self, **args)
            if not handler.is_async:
                return result
            if run_coroutine is not None:
                return run_coroutine(result)
            loop = asyncio.new_event_loop()
            try:
                return loop.run_until_complete(result)
            finally:
                loop.close()

        if resource is None:
            return call()
        with self.lock(resource, ttl=handler.contract.lock_ttl):
            return call()

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
        return self._event(
            name,
            self.redacted(data),
            status,
            resource,
            resource_version,
            side_effect,
            output_ref,
            hlc,
        )

    def _event(
        self,
        name: str,
        data: dict[str, Any],
        status: str | None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        hlc: int | None = None,
    ) -> TraceEvent:
        """``event`` with ``data`` as it is (already redacted)."""
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
                "data": data,
                "id": None,
            }
        )

    def record(self, name: str, **kwargs: Any) -> TraceEvent:
        """Record a domain event; it commits with the step (or the ack)."""
        event = self.event(name, **kwargs)
        self._pending.events.append(event)
        return event

    def record_step(
        self, name: str, status: str, data: dict[str, Any], output_ref: str | None = None
    ) -> TraceEvent:
        """Record a step's own event (``step.started``, ``step.finished``...).

        Its data is replayq's: the step's name, its duration, and values the step
        already recorded redacted (its result through ``encoded``, its error through
        ``redactor.error``). So the name is screened as a text and the keys as field
        names, and the value is not walked again; a key that names a secret field
        (a user's rule) sends it through ``redacted`` as any event's data.
        """
        redactor = self.redactor
        for key in data:
            if redactor.secret_field(key):
                return self.record(name, status=status, output_ref=output_ref, **data)
        data["step_name"] = redactor.text(data["step_name"])
        event = self._event(name, data, status, output_ref=output_ref)
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

    def trace_fence(self) -> TraceFence | None:
        """The lease this context's writes are fenced by (``None`` without an owner token)."""
        if self.owner_token is None:
            return None
        return TraceFence(self.job.id, self.owner_token)

    def fence(self, tx: Transaction, refused: list[str], **details: Any) -> None:
        """Raise ``LeaseLostError`` in ``tx`` unless the lease is held; the refusal is traced.

        The ``write.fenced`` event waits with the attempt's other events (``tx`` is
        about to roll back) and commits with the attempt's failure or rejection.
        """
        if not self.lease_held(tx):
            self.refuse(refused, **details)

    def append_fenced(
        self, tx: Transaction, events: list[TraceEvent], refused: list[str], **details: Any
    ) -> None:
        """``tx.trace_append(events)`` as the fence of ``tx``'s writes: the lease check is
        the statement that writes the events (no statement of its own). Without the lease
        nothing is appended and ``LeaseLostError`` is raised, as ``fence`` raises it."""
        if not tx.trace_append(events, self.trace_fence()):
            self.refuse(refused, **details)

    def refuse(self, refused: list[str], **details: Any) -> NoReturn:
        """Trace ``write.fenced`` and raise ``LeaseLostError``: the lease is gone."""
        self.record_fenced(refused, **details)
        raise LeaseLostError(
            f"job {self.job.id} attempt {self.attempt}: the lease was taken by another "
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
        cached = self.cache.pending if self._built("cache") else []
        return [*self._pending.what, *cached]

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

    def flush(
        self, tx: Transaction, *, failed: bool = False, fence: TraceFence | None = None
    ) -> bool:
        """Write what is pending into ``tx``: events and their blobs always; writes unless
        the attempt failed. With ``fence``, ``False`` (the events not appended) when the
        lease is gone: the caller must then roll ``tx`` back."""
        for blob in self._pending.blobs:
            blob(tx)
        if not failed:
            for write in self._pending.writes:
                write(tx)
        return tx.trace_append(self._pending.events, fence)

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
        self._pending = _Pending()
        if self._built("cache"):
            self.cache.after_commit()

    def discard_writes(self) -> None:
        """A step failed: its writes never happen; its events are kept for the record."""
        self._pending.writes.clear()
        self._pending.what.clear()
        if self._built("state"):
            self.state.discard_pending()
        if self._built("cache"):
            self.cache.discard_pending()

    def commit_now(self, *, failed: bool = False) -> None:
        """Commit what is pending in a transaction of its own (a step boundary).

        The writes commit only if this context's owner token still holds the job's
        lease, checked in the database in the same transaction: the statement that
        appends the step's events checks it (``trace_append`` with a ``TraceFence``,
        no statement of its own; on PostgreSQL it keeps the job row as read until the
        commit). Once another worker took the job the writes are refused
        (``LeaseLostError``, traced as ``write.fenced``); the attempt's events are
        still kept. The events are appended after the writes, so a write's own check
        (a version conflict, a stale lock token: ``state.write_rejected``) refuses it
        first; the lease is then asked in the same transaction, and without it the
        error is always ``LeaseLostError``. Everything rolls back.
        """
        refused = self.pending_writes() if not failed else []
        fence = self.trace_fence() if refused else None
        lost = LeaseLostError(
            f"job {self.job.id} attempt {self.attempt}: the lease was taken by "
            f"another worker; not committed: {', '.join(refused)}"
        )
        with self.runtime.storage.transaction() as tx:
            try:
                held = self.flush(tx, failed=failed, fence=fence)
            except Exception as exc:
                # A write's own check refused it (its event is recorded): without the
                # lease, the lease is the reason.
                if fence is None or self._held_after_failure(tx):
                    raise
                raise lost from exc
            if not held:
                raise lost
        self.committed()

    def _held_after_failure(self, tx: Transaction) -> bool:
        """Whether the lease is held, asked in ``tx`` after one of its writes failed; a
        transaction the database already aborted cannot answer, and the write's own
        error stands (``True``)."""
        try:
            return self.lease_held(tx)
        except Exception:
            return True

    # -- steps and decisions ----------------------------------------------------------------

    @overload
    def step(self, name: str, /) -> AbstractContextManager[None]: ...

    @overload
    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def step(
        self, name: str, fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any
    ) -> Any:
        """A logical step: its state writes, outbox rows, child jobs and events commit together.

        ``result = ctx.step("load", fn, *args, **kwargs)`` runs ``fn`` as the step and
        returns its result (JSON), recorded with the step's commit. Under the contract's
        ``resume="step"`` (the default) a retry does not run a step that committed in an
        earlier attempt: the recorded result is returned and the trace says
        ``step.skipped`` (see ``replayq.recording.steps``).

        ``with ctx.step("load"):`` is the same commit boundary around a block. A block
        always runs, so it is never skipped: it runs again on every attempt.
        """
        self.check_cancelled()
        if fn is None:
            return self.step_block(name, self.next_step_key(name))
        return run_step(self, name, fn, args, kwargs)

    def next_step_key(self, name: str) -> str:
        """Take the next position for a step called ``name`` (``load``, ``load#2``, ...)."""
        occurrence = self._step_counts.get(name, 0) + 1
        self._step_counts[name] = occurrence
        return step_key(name, occurrence)

    def step_block(
        self, name: str, key: str, outcome: dict[str, Any] | None = None
    ) -> AbstractContextManager[None]:
        """The commit boundary of step ``name`` at position ``key``; ``outcome`` joins its
        ``step.finished`` event (a callable step's result). See ``recording.steps``."""
        return step_boundary(self, name, key, outcome)

    def enter_step(self, name: str, key: str) -> None:
        """Events recorded from now on belong to step ``name`` at position ``key``."""
        self._steps.append(name)
        self._step_keys.append(key)

    def leave_step(self) -> None:
        """The innermost step ended (its events are recorded)."""
        self._steps.pop()
        self._step_keys.pop()

    def unrecord(self, event: TraceEvent) -> None:
        """Take a pending event back (a step's success that its commit refused)."""
        self._pending.events = [e for e in self._pending.events if e is not event]

    def decide(self, name: str, value: Any, **why: Any) -> Any:
        """Record a decision and its reasons; returns ``value``."""
        self.check_cancelled()
        # One walk checks the value and the reasons (events are written without one).
        self.encode({"value": value, "why": why}, what=f"decision {name!r}")
        self.record("decision", decision=name, value=value, why=why)
        return value

    # -- external reads ---------------------------------------------------------------------

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an external read and record request, response (or error) and duration.

        With a coroutine function (or a coroutine) it returns a coroutine to await on the
        handler's loop: ``await ctx.call(name, client.get, url)`` (``recording.aio``).
        """
        self.check_cancelled()
        return run_flow(record_call(self, name, fn, args, kwargs), fn)

    def effect(self, kind: str, fn: Callable[[], Any], *, key: str | None = None) -> Any:
        """Run a side effect once per idempotency key (see ``replayq.recording.effects``).

        With a coroutine function (or a coroutine) it returns a coroutine to await:
        ``await ctx.effect(kind, send_async, key=...)``.
        """
        self.check_cancelled()
        return self.effects.run(kind, fn, key=key)

    # -- recorded nondeterminism ------------------------------------------------------------

    def _nondeterministic(self, name: str, produce: Callable[[], Any]) -> Any:
        value = self.world.answer(name, name, "")
        if value is LIVE:
            value = produce()
        self.record(name, value=value)
        return value

    def now(self) -> float:
        """The current time, recorded (replay returns the recorded value)."""
        return float(self._nondeterministic("clock.now", self.runtime.clock.now))

    def random(self) -> float:
        """A random float in [0, 1), recorded."""
        return float(self._nondeterministic("random.random", _random.random))

    def uuid(self) -> str:
        """A random UUID (hex), recorded."""
        return str(self._nondeterministic("random.uuid", lambda: _uuid.uuid4().hex))

    # -- locks, child jobs ------------------------------------------------------------------

    def lock(self, resource: str, *, ttl: Any = None, wait: Any = None) -> LockHandle:
        """A lease lock with an owner token and a fencing token (``with ctx.lock(...) as lk:``)."""
        self.check_cancelled()
        return self.locks.handle(resource, ttl=ttl, wait=wait)

    def db_write(self, fn: Callable[[Any], Any], *, key: str | None = None) -> None:
        """Write the application's own tables in the transaction that commits this step.

        ``fn(connection)`` runs at the step's commit on replayq's own connection
        (``sqlite3`` or ``psycopg``, same database), so the application's rows commit
        or roll back together with the step's state writes, outbox rows and trace
        events — and, outside any step, with the job's ack. With ``key`` it runs at
        most once per key: a processed-operation record is written in the same
        transaction, and a later attempt finding it skips ``fn`` (recorded as
        deduplicated). A replay or fork never runs ``fn``.
        """
        self.check_cancelled()
        defer_db_write(self, fn, key)

    def enqueue(self, job_type: str, payload: dict[str, Any] | None = None, **options: Any) -> None:
        """Enqueue a child job in the step's transaction (causation: this job)."""
        self.check_cancelled()
        defer_child_job(self, job_type, payload or {}, options)

    def __repr__(self) -> str:
        return f"<Context job={self.job.id} type={self.job.job_type} attempt={self.attempt}>"
