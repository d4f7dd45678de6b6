"""The recording context: a handler's only door to the world.

Everything that passes through ``ctx`` is recorded as a domain event in the
job's trace. Events and state writes wait in the context until the step that
made them commits (``with ctx.step(...)`` or ``ctx.step(name, fn)``) or, outside
steps, until the job is acked: the step's state writes, outbox rows, child jobs and
events commit in one transaction. Two things commit at once because other workers
must see them: lock acquisition/release and idempotency records around effects (a
lock let go of while writes under it wait is released by their commit, after them).

Fencing: a worker's context carries the job's ``owner_token``. Every transaction
that writes for the job — a step's commit, an effect's claim and its result, a
lock's acquisition — asks the database whether that token still holds the job's
lease: the statement that appends the transaction's events checks it
(``trace_append`` with a ``TraceFence``), or ``tx.lease_check`` where no event is
appended. Once the lease was taken by another worker the
write is refused with ``LeaseLostError``, nothing of it commits, and the trace
records ``write.fenced`` naming what was refused. Contexts without a lease
(replays, forks, guarded reruns) have no owner token and are not fenced by one.

A worker's heartbeat that finds the lease lost also stops the handler: it sets the
cancel flag beside the lost one, so the next cancel point raises ``LeaseLostError``
before it does anything (a ``ctx.call`` does not call out while another worker runs the
job) and ``ctx.cancelled`` reads True; ``ctx.lease_lost`` tells the two causes apart.
The lost lease costs a cancel point nothing more: the cause is asked only once the one
flag every cancel point reads is set.

Every read of the outside world goes through the context's ``World``
(``replayq.recording.world``): live for workers; recorded, gated or stubbed
for the replay engine. The context never asks which world it is in.

A context serves one handler call. It ends when the handler returns or raises (``run``
calls ``end``), before what ran it settles the attempt (a worker's ack, handed to its
group commit; a replay's last commit): code that kept ``ctx`` past that (a thread, a
closure called later, an ``asyncio`` task) gets ``ContextEndedError`` from every view,
every view kept in a variable (``s = ctx.state``), every verb with a cancel point and
``ctx.now/random/uuid``, where it would otherwise record into an attempt whose last commit
it may or may not make. The settle itself goes on with the context's own methods (what
is pending, its commit). ``release`` drops the views once the attempt is settled.
"""

from __future__ import annotations

import random as _random
import threading
import uuid as _uuid
from _thread import get_ident
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar, overload

from replayq.errors import (
    ContextEndedError,
    JobCancelledError,
    LeaseLostError,
    StepLeftOpenError,
)
from replayq.model import Job, TraceEvent
from replayq.queue.handlers import Handler
from replayq.recording.aio import close_unstarted, run_flow, task_or_thread
from replayq.recording.attempt import ENDED, ended_error
from replayq.recording.cache import CacheView
from replayq.recording.callbacks import Callback, refuse_inside
from replayq.recording.calls import record_call
from replayq.recording.effects import EffectRunner
from replayq.recording.ledger import step_key
from replayq.recording.locks import LockHandle, LockManager
from replayq.recording.outbox import OutboxView
from replayq.recording.recorder import PendingRecord, Recorder, StepFlow
from replayq.recording.state import StateView
from replayq.recording.steps import StepBoundary, run_step
from replayq.recording.world import LIVE, LiveWorld, LostFlag, World
from replayq.recording.writes import defer_child_job, defer_db_write
from replayq.runtime import RuntimeSource

T = TypeVar("T")

# What ``Context.end`` puts in place of the cancel flag, and the mark of an ended context:
# always set, so every verb's cancel point (``check_cancelled``) is reached and says the
# attempt ended. No check of its own on the way of a live attempt's every step and call.
_ENDED = ENDED

# The verb that records each event of ``Context._nondeterministic`` (a refusal names it).
_NONDETERMINISTIC_VERBS = {
    "clock.now": "ctx.now()",
    "random.random": "ctx.random()",
    "random.uuid": "ctx.uuid()",
}


class Context(Recorder):
    """What a handler receives as its first argument."""

    # The views, built on first use (most handlers touch few of them, many touch none):
    # plain attributes, ``None`` until then, read through properties (a descriptor that
    # put them in the instance's ``__dict__`` cost a ``_built()`` call at each commit:
    # ~70 K instructions a traced job). None is built after ``end`` (asked where a view is
    # built, so a read of a built view asks nothing more); a view built before refuses at
    # its own entry points (``StateView.get``...); ``release`` drops them.
    _locks: LockManager | None = None
    _state: StateView | None = None
    _cache: CacheView | None = None
    _outbox: OutboxView | None = None
    _effects: EffectRunner | None = None
    # The cancel flag ``end`` took the place of (``cancel_requested`` reads it).
    _flag_at_end: LostFlag | None = None
    # Whether the cancel flag was set when the handler returned (``run``): only a cancel
    # the handler could have seen stops an attempt that returned (``stopped_before_return``).
    _cancel_at_return = False
    # A step ended by its generator's close while writes waited (``StepBoundary._ended``).
    _abandoned_step: str | None = None

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
        # Set by the worker's heartbeat once the running job was asked to stop or its lease
        # was found lost (``world.lease_lost()`` then true): every cancel point reads it.
        self._cancel = cancel
        self._trace_id = trace_id or job.trace_id
        # Held by ``end`` while it ends the attempt, and by a ``ctx.call``/``ctx.effect``
        # while it looks whether the attempt ended and records (or claims, or commits its
        # outcome): one run in a thread or a task that outlived the handler either records
        # before the end, or sees the end and records nothing into the trace after it.
        self._live = threading.Lock()
        self._pending_lock = threading.RLock()
        # Held by ``end`` as it sets the end (inside ``_pending_lock``) and by a read while it
        # looks at the end and records (``_hold_read``): never by a commit, so a read does
        # not wait for another flow's commit (whose ``ctx.db_write`` function may wait for
        # the reading thread).
        self._end_lock = threading.Lock()
        # Set while a ``ctx.db_write`` function runs inside a commit of this attempt (held
        # under ``_live`` at a step's): the verbs refuse in its thread (``recording.callbacks``).
        self._callback: Callback | None = None
        self._pending = PendingRecord()
        self._running: dict[object, StepFlow] = {}
        # Which flow runs now (``Recorder._running``): a thread, or an async handler's task.
        self._flow_key = task_or_thread if handler.is_async else get_ident
        # The handler's own flow (its thread, its task), once it runs (``run``): it starts
        # the threads and tasks, never one of them (``_outbox_step_key``).
        self._home: object = None
        self._seq = 0
        self._step_counts: dict[str, int] = {}
        self.blob_limit = runtime.limits.blob_limit_bytes
        # Applied to every value before it enters the recording (``redacted``).
        self.redactor = handler.redactor or runtime.redactor

    # -- views, built on first use --------------------------------------------------------

    @property
    def locks(self) -> LockManager:
        """This attempt's locks (``LockManager``), built on first use."""
        view = self._locks
        if view is None:
            if self._callback is not None:
                refuse_inside(self, "ctx.locks")
            if self._cancel is _ENDED:
                raise self._ended_error()
            view = self._locks = LockManager(self)
        return view

    @property
    def state(self) -> StateView:
        """Reads and writes of versioned entities (``StateView``), built on first use."""
        view = self._state
        if view is None:
            if self._callback is not None:
                refuse_inside(self, "ctx.state")
            if self._cancel is _ENDED:
                raise self._ended_error()
            view = self._state = StateView(self)
        return view

    @property
    def cache(self) -> CacheView:
        """Recorded cache reads and writes (``CacheView``), built on first use."""
        view = self._cache
        if view is None:
            if self._callback is not None:
                refuse_inside(self, "ctx.cache")
            if self._cancel is _ENDED:
                raise self._ended_error()
            view = self._cache = CacheView(self)
        return view

    @property
    def outbox(self) -> OutboxView:
        """The transactional outbox (``OutboxView``), built on first use."""
        view = self._outbox
        if view is None:
            if self._callback is not None:
                refuse_inside(self, "ctx.outbox")
            if self._cancel is _ENDED:
                raise self._ended_error()
            view = self._outbox = OutboxView(self)
        return view

    @property
    def effects(self) -> EffectRunner:
        """What runs ``ctx.effect`` calls (``EffectRunner``), built on first use."""
        view = self._effects
        if view is None:
            if self._callback is not None:
                refuse_inside(self, "ctx.effects")
            if self._cancel is _ENDED:
                raise self._ended_error()
            view = self._effects = EffectRunner(self)
        return view

    def fences(self) -> dict[str, int]:
        """The fencing token of every lock this attempt holds, by resource."""
        return self._locks.fences() if self._locks is not None else {}

    def renew_locks(self) -> None:
        """Renew the locks this attempt holds (the worker's heartbeat; builds no view)."""
        locks = self._locks
        if locks is not None and (locks.held or locks.waiting):
            locks.renew_all()

    # -- the end of the attempt -------------------------------------------------------------

    def end(self) -> None:
        """The handler call is over: refuse any later use with ``ContextEndedError``.

        ``run`` calls it when the handler returns or raises, before what ran the attempt
        settles it (a worker's ack, handed to its group commit). A handler that kept
        ``ctx`` (a thread, a closure called later, an ``asyncio`` task) then gets that
        error from a view (``ctx.state``..., and a view kept in a variable), a verb with a
        cancel point (``ctx.step``, ``ctx.call``, ``ctx.effect``, ``ctx.decide``,
        ``ctx.lock``...) and ``ctx.now/random/uuid``, where it would otherwise record into
        an attempt whose last commit it may or may not make; ``ctx.cancelled`` reads True.
        ``ctx.job``, ``ctx.payload`` and the attempt's identity stay readable (nothing is
        recorded by reading them). What settles the attempt goes on with what is pending
        (``flush``, ``committed``...): those are not the handler's. Idempotent.
        """
        cancel = self._cancel
        if cancel is not _ENDED:
            # After any ``ctx.call``/``ctx.effect`` recording right now (another thread's):
            # from here on they find the attempt ended (``_live``).
            with self._live:
                if self._cancel is _ENDED:
                    return  # another thread's end ran meanwhile: once only
                self._flag_at_end = cancel
                # Under ``_pending_lock`` too: a write made outside steps (``ctx.state.put``,
                # ``ctx.outbox.publish``...) looks at the end and joins the pending record
                # under it, so it is in what the ack or failure flushes after the end, or
                # refused; never joined after that flush, and forgotten with its record.
                # And ``_end_lock``, which a read looks at the end under (``_hold_read``).
                with self._pending_lock:
                    end_lock = self._end_lock
                    end_lock.acquire()
                    self._cancel = _ENDED
                    end_lock.release()
                if self._running:
                    self._record_abandoned_steps()

    def _record_abandoned_steps(self) -> None:
        """The attempt ends while steps still run (a thread or task the handler left in a
        step; a generator suspended in one, ``_refuse_step_left_open``): their end will
        never be recorded, and their writes are dropped (``StepBoundary``). A
        ``step.abandoned`` event for each flow's outermost running step says so, naming
        the steps of that flow still open, outermost first, so that the trace does not
        leave them open with their writes looking committed (``uncommitted_writes``).
        Under ``_live``, as a step's end looks at the attempt's (none ends meanwhile). A
        step's own event: it belongs to no step (as an outermost step's start). Not
        compared by replay (``compare.signature``): when a step outlives its attempt
        depends on timing, not on what the handler decided."""
        for flow in list(self._running.values()):
            if not isinstance(flow, StepBoundary):
                continue
            data = {
                "step_name": flow.name,
                "step_key": flow.key,
                # Never empty: a step's end takes its name off under ``_live`` too.
                "open_steps": list(flow.step_names),
                "reason": "still running when its attempt ended: its end is not recorded "
                "and its writes are not committed",
            }
            event = self._event("step.abandoned", self.redactor.value(data), "abandoned", steps=())
            self._pending.events.append(event)

    def release(self) -> None:
        """The attempt is settled (its ack or failure committed, or its run done): ``end``
        it if it was not, and drop the views built in it (they refer back to the context,
        and a settle still commits their pending writes until then)."""
        self.end()
        # Only the views built are dropped: one never built is the class's ``None`` already
        # (an instance attribute set to ``None`` would grow the instance's dict each job).
        if self._locks is not None:
            # A release still waiting for a commit of this attempt waits for none now.
            self._locks.abandon()
            self._locks = None
        if self._state is not None:
            self._state = None
        if self._cache is not None:
            self._cache = None
        if self._outbox is not None:
            self._outbox = None
        if self._effects is not None:
            self._effects = None

    def _refuse_inside(self, verb: str) -> None:
        """Refuse ``verb`` if this thread runs a ``ctx.db_write`` function of this attempt
        (``recording.callbacks``); asked by a view's entry point where ``_callback`` is set."""
        refuse_inside(self, verb)

    def _ended_error(self) -> ContextEndedError:
        """The error a use of this context after ``end`` raises."""
        return ended_error(self.job.id, self.attempt)

    def _hold_pending(self) -> Any:
        """Take ``_pending_lock`` for a verb to join what it records to the pending record
        (its event and its write, its after-commit action, its read's event), and return it
        held; or, once the attempt has ended, let it go and raise ``ContextEndedError``.

        ``end`` sets the end under this lock, and the ack or failure flushes the pending
        record after the end: what joins under one hold is in that flush or refused, never
        joined after it and forgotten with its record (a thread the handler left running
        would have its call return, and nothing of it committed). The caller joins all of
        it before it lets go (``try``/``finally``: ``lock.release()``): a ``record`` and
        a ``defer`` each under a hold of its own could be cut apart by the end. Not a
        context manager: a ``with`` over one cost ~2 K instructions more a call than this
        (one Python call, ~0.4 K), at every ``ctx.state.put`` and ``get``."""
        lock = self._pending_lock
        lock.acquire()
        if self._cancel is _ENDED:
            lock.release()
            raise self._ended_error()
        return lock

    def _hold_read(self) -> Any:
        """As ``_hold_pending`` for a read's events alone (``ctx.state.get``,
        ``ctx.cache.get``): ``_end_lock`` taken, which ``end`` sets the end under and no
        commit holds. A read joins no write to the pending record, and its events join the
        list a commit flushing meanwhile leaves to the next one (``flush``): it needs only
        to be before the end or refused. Under ``_pending_lock`` it waited for another
        flow's whole commit, and hung for good when that commit's ``ctx.db_write`` function
        waited for the reading thread (``tests/conformance/test_context_read_waits.py``)."""
        lock = self._end_lock
        lock.acquire()
        if self._cancel is _ENDED:
            lock.release()
            raise self._ended_error()
        return lock

    # -- what the views hold for the next commit (hooks of ``Recorder``) -------------------

    def _views_pending(self) -> list[str]:
        return self._cache.pending if self._cache is not None else []

    def _views_committed(self) -> None:
        if self._cache is not None:
            self._cache.after_commit()
        locks = self._locks
        if locks is not None and locks.deferred:
            locks.released()

    # ``Recorder``'s, with the hooks above inlined (asked at every step's end and commit).

    def pending_writes(self) -> list[str]:
        what = self._pending.what
        if self._cache is not None:
            return [*what, *self._cache.pending]
        return [*what]

    def _adopt_step_cache(self, held: list[tuple[Callable[[], None], str]]) -> None:
        """A step ended: what its flow held for after the commit (cache writes) waits for
        the commit that follows at once (the step's)."""
        self.cache.adopt(held)

    def _views_discard_only(self, resources: set[str | None]) -> None:
        if self._state is not None:
            self._state.discard_pending(resources)
        if self._cache is not None:
            self._cache.discard_pending()

    def _views_discard(self) -> None:
        if self._state is not None:
            self._state.discard_pending()
        if self._cache is not None:
            self._cache.discard_pending()

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
    def current_step_key(self) -> str | None:
        """The position of the innermost step running in this flow (this thread; in an
        ``async def`` handler, this task): ``load``, ``load#2``, if any. A step another
        thread or task runs meanwhile is not this flow's."""
        running = self._running
        flow = running.get(self._flow_key()) if running else None
        return flow.step_keys[-1] if flow is not None and flow.step_keys else None

    @property
    def _outbox_step_key(self) -> str | None:
        """The step position an outbox event published now is numbered under (its id,
        ``OutboxView``): this flow's innermost step's; in no step of its own (a thread or
        task a step started) while steps run in one other flow alone, that flow's
        innermost step's, whose commit takes the row. A resumed retry skips that step and
        so the thread's publish: numbered among the job's publishes outside steps, it
        moved theirs, and the first one the handler makes on the retry took the id of
        the skipped thread's row and was dropped as its duplicate. The handler's own flow
        outside its steps, or while steps run in several other flows: ``None`` (the
        job's; the handler runs that code again on every attempt, whether a step of a
        thread it started runs meanwhile or not; which of several steps' commits takes
        the row is timing)."""
        running = self._running
        if not running:
            return None
        flow_key = self._flow_key()
        flow = running.get(flow_key)
        if flow is None:
            if flow_key == self._home:
                return None
            flows = list(running.values())
            if len(flows) != 1:
                return None
            flow = flows[0]
        return flow.step_keys[-1] if flow.step_keys else None

    @property
    def cancelled(self) -> bool:
        """True once the attempt must stop: the job was asked to stop (``replayq jobs
        cancel``) while it ran, or the worker's heartbeat found its lease lost.

        A handler in a long loop can check it and return; otherwise its next step
        boundary or ``ctx`` call raises ``JobCancelledError`` (asked to stop) or
        ``LeaseLostError`` (the lease lost: another worker holds the job now).
        ``ctx.lease_lost`` tells the two apart. The worker notices either at its
        next heartbeat.
        """
        return self._cancel is not None and self._cancel.is_set()

    @property
    def cancel_requested(self) -> bool:
        """Whether the job was asked to stop or its lease found lost (the heartbeat's flag),
        read by what ran the attempt once the handler returned: ``cancelled`` reads True
        from then on whatever the cause (``end``)."""
        flag = self._cancel
        if flag is _ENDED:
            flag = self._flag_at_end
        # ``LostFlag.is_set``'s read, without its call: asked at every ack.
        return flag is not None and flag._set

    @property
    def stopped_before_return(self) -> bool:
        """Whether the heartbeat's flag (a cancel request, or the lease found lost) was
        already set when the handler returned: the handler could have seen it
        (``ctx.cancelled``) and returned early. ``False`` for a cancel that arrived after
        the return: the handler had completed, and its attempt stands (the worker acks it
        and notes the cancel as arriving too late)."""
        return self._cancel_at_return

    def check_cancelled(self) -> None:
        """A cancel point: raise ``JobCancelledError`` if the job was asked to stop,
        ``LeaseLostError`` if the heartbeat found the lease lost, and ``ContextEndedError``
        once the attempt has ended (``end``)."""
        cancel = self._cancel
        if cancel is not None and cancel.is_set():
            if cancel is _ENDED:
                raise self._ended_error()
            before = self.current_step or "its next step"
            if self.world.lease_lost():
                raise LeaseLostError(
                    f"job {self.job.id} attempt {self.attempt}: the heartbeat found the lease "
                    f"taken by another worker; it stops before {before}"
                )
            raise JobCancelledError(
                f"job {self.job.id} attempt {self.attempt} was asked to stop; "
                f"it stops before {before}"
            )

    def _stop_before_call(self, fn: Any) -> None:
        """``check_cancelled`` for a verb about to call ``fn``: a coroutine the handler
        passed (``ctx.call(name, fetch())``) is closed, never to be awaited."""
        try:
            self.check_cancelled()
        except BaseException:
            close_unstarted(fn)
            raise

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found this worker no longer holds the job's lease (then
        ``cancelled`` is True too, and cancel points raise ``LeaseLostError``)."""
        return self.world.lease_lost()

    # -- running ----------------------------------------------------------------------------

    def run(
        self,
        run_coroutine: Callable[[Coroutine[Any, Any, Any]], Any] | None = None,
        args: tuple[Any, ...] | Mapping[str, Any] | None = None,
    ) -> Any:
        """Call the handler with the job's payload, inside the contract's lock if it has one.

        An ``async def`` handler's coroutine is handed to ``run_coroutine`` (a worker's
        one event loop, shared by its async jobs) or, without one, run on a new loop.
        ``args``: the payload as ``PayloadShape.decode`` gave it, where the caller decoded
        it already (the worker, which buries a payload that does not decode).
        """
        handler, payload = self.handler, self.job.payload
        lock = handler.keys.lock  # a field the payload leaves out: its default, as at enqueue
        resource = None if lock is None else lock.render(payload)
        if args is None:
            # Typed fields (Decimal, datetime, a dataclass...) from their stored JSON form.
            args = handler.decode_payload(payload, self.redactor)  # a refusal: screened

        def call() -> Any:
            if not handler.is_async:
                self._home = get_ident()  # an async handler's, in its task
            if isinstance(args, tuple):
                result = handler.fn(self, *args)
            else:
                result = handler.fn(self, **args)
            if handler.is_async:
                # Its steps ran in the coroutine's task: asked there, once it returns.
                result = self._steps_closed_at_return(result)
                if run_coroutine is not None:
                    result = run_coroutine(result)
                else:
                    import asyncio  # late, as worker/event_loop.py says why

                    loop = asyncio.new_event_loop()
                    try:
                        result = loop.run_until_complete(result)
                    finally:
                        loop.close()
            elif self._running or self._abandoned_step:
                self._refuse_step_left_open()
            # The handler returned: what it was asked before now, it could have seen. The
            # flag's attribute read as ``LostFlag.is_set`` reads it (no call per job).
            cancel = self._cancel
            if cancel is not None and cancel._set:
                self._cancel_at_return = True
            return result

        try:
            if resource is None:
                return call()
            with self.lock(resource, ttl=handler.contract.lock_ttl):
                return call()
        finally:
            # The handler returned (or raised): a ctx it kept refuses from here on, before
            # the caller settles the attempt (a worker hands its ack to the group commit).
            self.end()

    async def _steps_closed_at_return(self, handler_call: Coroutine[Any, Any, T]) -> T:
        """An ``async def`` handler's ``handler_call`` awaited, then, in its own task (the
        flow its steps ran in: ``_flow_key``), ``_refuse_step_left_open`` asked if a step
        runs or one was abandoned. One coroutine more an async job: its task's key is known
        only inside it (the loop that runs it is the caller's)."""
        self._home = self._flow_key()
        result = await handler_call
        if self._running or self._abandoned_step:
            self._refuse_step_left_open()
        return result

    def _refuse_step_left_open(self) -> None:
        """The handler returned with a step of its own flow still open (its thread; an
        ``async def`` handler's task): a generator (an async generator) suspended inside
        ``with ctx.step(...)`` and kept past the return (one dropped or closed ends its
        step at once; an async one only once ``aclose()`` ran). That step holds this
        flow's writes, those the handler made after it outside any step too; the ack would
        drop them while the job succeeded. The attempt fails instead, saying so
        (``StepLeftOpenError``): none of those writes is committed.

        So it does after a step that a generator's close ended (a loop over the generator
        left early, or it was closed or dropped while suspended in the step) while writes
        waited: ``GeneratorExit`` ends the step as failed, dropping its flow's writes and
        the attempt's pending ones, and ``close()`` swallows it: the handler never heard."""
        open_step = self._running.get(self._flow_key())
        if isinstance(open_step, StepBoundary):
            kept = (
                "an async generator suspended in the step and kept? one an `async for` "
                "loop left early is closed only later, by asyncio: contextlib.aclosing "
                "closes it at the loop's end"
                if self.handler.is_async
                else "a generator suspended in the step and kept?"
            )
            raise StepLeftOpenError(
                f"the handler returned inside ctx.step({open_step.name!r}), which never "
                f"ended ({kept}); its writes and those made after it are not committed",
                step=open_step.name,
            )
        abandoned = self._abandoned_step
        if abandoned is not None:
            raise StepLeftOpenError(
                f"ctx.step({abandoned!r}) was ended by its generator's close (a loop over "
                "the generator left early, or the generator closed or dropped while "
                "suspended in the step): the step ended as failed, and its writes, those "
                "made while it was open and the attempt's pending ones were dropped; the "
                "attempt fails rather than succeed without them",
                step=abandoned,
            )

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
        if self._callback is not None:
            refuse_inside(self, f"ctx.step({name!r})")
        cancel = self._cancel
        if cancel is not None and cancel.is_set():
            self.check_cancelled()
        redactor = self.redactor
        if name not in redactor._clean_texts:
            # The step's name as its events record it (redacted), here and from here on: its
            # position (the step ledger's row, an outbox row's id) and what a replay finds it
            # by (a skipped step's recorded ``step_key``, a fork's point) hold no secret.
            name = redactor.short_text(name)
        if fn is None:
            # ``next_step_key`` and ``step_block`` inlined: every step of every job passes here.
            counts = self._step_counts
            occurrence = counts.get(name, 0) + 1
            counts[name] = occurrence
            return StepBoundary(self, name, step_key(name, occurrence) if occurrence > 1 else name)
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
        return StepBoundary(self, name, key, outcome)

    def unrecord(self, event: TraceEvent) -> None:
        """Take a pending event back (a step's success that its commit refused); in place,
        as ``rode`` takes events out."""
        pending = self._pending.events
        held = len(pending)
        pending[:held] = [e for e in pending[:held] if e is not event]

    def decide(self, name: str, value: Any, **why: Any) -> Any:
        """Record a decision and its reasons; returns ``value``."""
        if self._callback is not None:
            refuse_inside(self, f"ctx.decide({name!r})")
        self.check_cancelled()
        # One walk checks the value and the reasons (events are written without one) and
        # redacts them: the event takes the redacted parts without screening them again.
        checked = self.encoded({"value": value, "why": why}, what=f"decision {name!r}").inline
        # In what the ack or failure flushes, or refused (``_hold_pending``): a thread the
        # handler left running never gets its value back with the event forgotten.
        lock = self._hold_pending()
        try:
            if checked is None:  # above the inline limit: the event's data is redacted alone
                self.record("decision", decision=name, value=value, why=why)
            else:
                self.record_screened(
                    "decision",
                    ("value", "why"),
                    decision=name,
                    value=checked["value"],
                    why=checked["why"],
                )
        finally:
            lock.release()
        return value

    # -- external reads ---------------------------------------------------------------------

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an external read and record request, response (or error) and duration.

        With a coroutine function (or a coroutine) it returns a coroutine to await on the
        handler's loop: ``await ctx.call(name, client.get, url)`` (``recording.aio``).
        """
        if self._callback is not None:
            refuse_inside(self, f"ctx.call({name!r})", fn)
        cancel = self._cancel
        if cancel is not None and cancel.is_set():
            self._stop_before_call(fn)
        return run_flow(record_call(self, name, fn, args, kwargs), fn)

    def effect(self, kind: str, fn: Callable[[], Any], *, key: str | None = None) -> Any:
        """Run a side effect once per idempotency key (see ``replayq.recording.effects``).

        With a coroutine function (or a coroutine) it returns a coroutine to await:
        ``await ctx.effect(kind, send_async, key=...)``.
        """
        if self._callback is not None:
            refuse_inside(self, f"ctx.effect({kind!r})", fn)
        cancel = self._cancel
        if cancel is not None and cancel.is_set():
            self._stop_before_call(fn)
        return self.effects.run(kind, fn, key=key)

    # -- recorded nondeterminism ------------------------------------------------------------

    def _nondeterministic(self, name: str, produce: Callable[[], Any]) -> Any:
        if self._callback is not None:
            refuse_inside(self, _NONDETERMINISTIC_VERBS[name])
        # Not a cancel point (a cancelled attempt may still read its clock), but refused
        # once the attempt ended: the value would be recorded into a trace that is never
        # committed, and a replay could not answer it.
        if self._cancel is _ENDED:
            raise self._ended_error()
        value = self.world.answer(name, name, "")
        if value is LIVE:
            value = produce()
        # In the trace or refused, as ``decide``'s (``_hold_pending``).
        lock = self._hold_pending()
        try:
            self.record(name, value=value)
        finally:
            lock.release()
        return value

    def now(self) -> float:
        """The current time, recorded (replay returns the recorded value).

        ``ContextEndedError`` once the attempt ended (``end``), as ``random`` and ``uuid``."""
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
        if self._callback is not None:
            refuse_inside(self, f"ctx.lock({resource!r})")
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

        ``fn`` runs inside replayq's commit: it may use the connection only. A ``ctx``
        call in it raises ``CallbackReentryError`` (docs/recording-context.md).
        """
        if self._callback is not None:
            refuse_inside(self, "ctx.db_write")
        # Its event and its write in the ack's commit, or refused (``_hold_pending``).
        lock = self._hold_pending()
        try:
            self.check_cancelled()
            defer_db_write(self, fn, key)
        finally:
            lock.release()

    def enqueue(self, job_type: str, payload: dict[str, Any] | None = None, **options: Any) -> None:
        """Enqueue a child job in the step's transaction (causation: this job)."""
        if self._callback is not None:
            refuse_inside(self, f"ctx.enqueue({job_type!r})")
        # Its event and its write in the ack's commit, or refused (``_hold_pending``).
        lock = self._hold_pending()
        try:
            self.check_cancelled()
            defer_child_job(self, job_type, payload or {}, options)
        finally:
            lock.release()

    def __repr__(self) -> str:
        return f"<Context job={self.job.id} type={self.job.job_type} attempt={self.attempt}>"
