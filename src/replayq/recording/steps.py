"""Steps that return a result, so that a retry can resume at the failed step.

``ctx.step(name, fn, *args, **kwargs)`` runs ``fn`` as a step: its state writes,
outbox rows, child jobs and events commit together with a row of the step ledger
(``rq_steps``: job, step position, attempt, result; see ``recording.ledger``).
On a later attempt of the same job, under a contract with ``resume="step"``, the
context asks its ``World`` whether that position already committed; if it did,
``fn`` is not called, the recorded result is returned and the trace says
``step.skipped`` with the attempt it completed in.

A step's position is its name and how many steps of that name came before it
in the attempt (``load``, then ``load#2``...), so a loop of same-named steps
resumes at the right iteration as long as the handler runs its steps in the
same order on every attempt. ``with ctx.step(name):`` cannot skip its body (a
``with`` block always runs): it takes a position but is never recorded in the
ledger, and it re-runs on every attempt.

Known limits: the result is a snapshot of the first attempt (JSON only, under
the blob limit); state is not part of it — later steps read state from the
database as usual, and a write to an entity that this attempt never read is
checked against nothing (read it in the step that writes it).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol

from replayq.errors import LeaseLostError
from replayq.model import TraceEvent
from replayq.recording.attempt import ENDED, Attempt, ended_error, ended_late
from replayq.recording.recorder import StepFlow
from replayq.storage.protocol import StepComplete, Transaction

RESUME_STEP = "step"


class StepAttempt(Attempt, Protocol):
    """The parts of the context a callable step uses, beyond a view's ``Attempt``."""

    # The outermost step running in each flow (thread, task), by ``_flow_key()``: see
    # ``Recorder._running``. It holds the flow's step names and positions too
    # (``StepFlow.step_names``), which ``StepBoundary`` pushes and pops itself.
    _running: dict[object, StepFlow]
    _flow_key: Callable[[], object]
    # A step a generator's close ended (``GeneratorExit``) while writes waited: they were
    # dropped, and the handler never heard (``Context._refuse_step_left_open``).
    _abandoned_step: str | None

    @property
    def owns_job_trace(self) -> bool: ...

    def next_step_key(self, name: str) -> str: ...

    def step_block(
        self, name: str, key: str, outcome: dict[str, Any] | None = None
    ) -> AbstractContextManager[None]: ...

    def unrecord(self, event: TraceEvent) -> None: ...

    def pending_writes(self) -> list[str]: ...

    def discard_writes(self) -> None: ...

    def _discard_step_writes(self, dropped: list[Callable[[Transaction], None]] | None) -> None: ...

    def _adopt_step_writes(
        self, flow: StepFlow, writes: list[Callable[[Transaction], None]]
    ) -> None: ...

    def _adopt_step_cache(self, held: list[tuple[Callable[[], None], str]]) -> None: ...

    def commit_now(self, *, failed: bool = False, refused: list[str] | None = None) -> None: ...

    def record_fenced(self, refused: list[str], **details: Any) -> TraceEvent: ...

    def record_step(
        self,
        name: str,
        status: str,
        data: dict[str, Any],
        output_ref: str | None = None,
        steps: Sequence[str] | None = None,
    ) -> TraceEvent: ...


def run_step(
    ctx: StepAttempt,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``ctx.step(name, fn, ...)``: skip a position an earlier attempt committed, or run it."""
    key = ctx.next_step_key(name)
    resume = ctx.handler.contract.resume == RESUME_STEP
    done = ctx.world.completed_step(key) if resume else None
    if done is not None:
        with ctx._live:  # a step run in a thread: nothing recorded after the attempt's end
            if ctx._cancel is ENDED:
                raise ended_error(ctx.job.id, ctx.attempt)
            ctx.record(
                "step.skipped",
                status="skipped",
                step_name=name,
                step_key=key,
                completed_in=done.attempt,
                reason=f"completed in attempt {done.attempt}",
                result=None if done.result_ref else done.result,
                output_ref=done.result_ref,
            )
        return done.result
    outcome: dict[str, Any] = {}
    with ctx.step_block(name, key, outcome):
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: say so here instead of a RuntimeWarning later
            raise TypeError(
                f"ctx.step({name!r}, fn): fn returned an awaitable; the callable form runs "
                "plain functions (await inside a `with ctx.step(...)` block instead)"
            )
        # Recorded by the step's end (``StepBoundary._ended``), under ``_live`` once it
        # looked whether the attempt ended: ``fn`` may have returned after it (a thread).
        outcome["finish"] = (result, resume)
    return result


def _finish(
    ctx: StepAttempt, name: str, key: str, resume: bool, result: Any, outcome: dict[str, Any]
) -> None:
    """A callable step's result recorded: encoded into ``outcome`` (for its
    ``step.finished``), its blob and its ledger row pending for the step's commit."""
    inline, ref, raw, text = ctx.encoded(result, what=f"step {name!r} result")
    ctx.store_blob(raw, f"step {name!r} result", ref)
    outcome["result"] = inline
    outcome["output_ref"] = ref
    if resume and ctx.world.is_live and ctx.owns_job_trace:
        params = StepComplete(
            job_id=ctx.job.id,
            step_key=key,
            step_name=name,
            attempt=ctx.attempt,
            trace_id=ctx.trace_id,
            result=None if ref else text,
            result_ref=ref,
            now=ctx.runtime.clock.now(),
        )

        def complete(tx: Transaction) -> None:
            # False: an earlier attempt committed this position (resume was off then).
            tx.step_complete(params)

        ctx.defer(complete, pipelines=True)


class StepBoundary(StepFlow):
    """The commit boundary of a step: its writes and events commit together when it ends.

    A step that wrote nothing does not commit: its events wait for the attempt's next
    commit. A step that raises, or whose commit is refused, drops its writes and commits
    its events at once (the failure is the forensic fact). A class rather than a
    generator-based context manager: every step of every job passes here twice.

    The writes wait in the outermost step running in the same flow (thread; for an
    ``async def`` handler, ``asyncio`` task): ``flow``, this one or one it is nested in,
    in ``ctx._running`` while it runs, not with the attempt's other pending writes. So a
    commit in another flow (its step's, the ack) does not take them, and a step still
    running when its attempt ends (its body in a thread the handler left) has them
    dropped. A nested step's commit takes its flow's writes, as it always did.
    """

    __slots__ = ("ctx", "flow", "flow_key", "key", "name", "outcome", "started")

    # The outermost step of this one's flow that it is nested in (``None``: it is that step
    # itself; not ``self``, a cycle that would keep the context alive until the garbage
    # collector's next pass), and, for that outermost step, its flow's key (``None`` for a
    # nested one).
    flow: StepFlow | None
    flow_key: object

    def __init__(
        self, ctx: StepAttempt, name: str, key: str, outcome: dict[str, Any] | None = None
    ) -> None:
        self.ctx, self.name, self.key, self.outcome = ctx, name, key, outcome
        self.started = 0.0

    def __enter__(self) -> None:
        ctx, name = self.ctx, self.name
        if ctx._callback is not None:  # a block kept from before: ``ctx.step`` asked then
            ctx._refuse_inside(f"ctx.step({name!r})")
        ctx.world.on_step(name)
        running = ctx._running
        flow_key = ctx._flow_key()
        flow = running.get(flow_key) if running else None
        # Recorded before it runs: it belongs to the step it is nested in, if any.
        steps = flow.step_names if flow is not None else ()
        ctx.record_step("step.started", "started", {"step_name": name}, None, steps)
        if flow is None:
            # The outermost step of this attempt in this flow: it holds the flow's writes,
            # and its steps' names and positions (events recorded from now on in this flow
            # belong to this step; those of other flows, to theirs).
            self.writes = self.after = self.flow = None
            self.flow_key = flow_key
            self.step_names, self.step_keys = [name], [self.key]
            running[flow_key] = self
        else:
            self.flow, self.flow_key = flow, None
            flow.step_names.append(name)
            flow.step_keys.append(self.key)
        self.started = time.monotonic()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        ctx, name = self.ctx, self.name
        duration = round(time.monotonic() - self.started, 6)  # µs: what a trace can tell
        flow = self.flow or self
        # The look at the end and what the step records and commits under ``_live`` (as a
        # ``ctx.call``'s record): a body run in a thread past the handler's return either
        # ends before the end, or sees it and records nothing into the trace. The body
        # itself ran outside the lock.
        with ctx._live:
            # Its events from here on (its end) belong to the step it is nested in, if any;
            # under ``_live``, so the attempt's end (``Context.end``) sees it open or ended.
            flow.step_names.pop()
            flow.step_keys.pop()
            try:
                if ctx._cancel is ENDED:
                    self._drop()  # never committed: the attempt's end did not take them
                    outcome = "returned" if exc is None else f"raised ({type(exc).__name__})"
                    unrecorded = "its end not recorded, nothing of it committed"
                    raise ended_late(ctx, f"ctx.step({name!r})", outcome, unrecorded) from exc
                self._ended(ctx, name, duration, exc)
            finally:
                # Under ``_live`` too: the attempt's end finds the step running (and records
                # it abandoned: ``Context.end``) or ended, never ended but still listed.
                if self.flow is None:
                    del ctx._running[self.flow_key]

    def _drop(self) -> None:
        """The writes of this step's flow never happen."""
        flow = self.flow or self
        flow.writes = flow.after = None

    def _ended(
        self, ctx: StepAttempt, name: str, duration: float, exc: BaseException | None
    ) -> None:
        """The step's end while its attempt is live: its events recorded, its commit."""
        outcome = self.outcome
        if exc is None and outcome:
            finish = outcome.pop("finish", None)
            if finish is not None:
                try:
                    _finish(ctx, name, self.key, finish[1], finish[0], outcome)
                except BaseException as unrecordable:
                    self._ended(ctx, name, duration, unrecordable)  # as if failed in fn
                    raise
        if exc is not None:
            dropped = (self.flow or self).writes
            if isinstance(exc, GeneratorExit) and (dropped or ctx.pending_writes()):
                # ``close()`` swallows the exit: the handler goes on, the writes gone.
                ctx._abandoned_step = name
            self._drop()
            ctx._discard_step_writes(dropped)
            ctx.record(
                "step.finished",
                status="fail",
                step_name=name,
                duration=duration,
                error=ctx.redactor.error(exc),
            )
            ctx.commit_now(failed=True)
            return  # the step's exception goes on
        flow = self.flow or self
        writes = flow.writes
        if writes is not None:
            # Its flow's writes (its ledger row among them) commit with it.
            flow.writes = None
            ctx._adopt_step_writes(flow, writes)
        held = flow.after
        if held is not None:
            flow.after = None
            ctx._adopt_step_cache(held)
        data: dict[str, Any] = {"step_name": name, "duration": duration}
        output_ref = None
        if outcome:
            data["result"] = outcome["result"]  # redacted when recorded (``encoded``)
            output_ref = outcome["output_ref"]
        finished = ctx.record_step("step.finished", "success", data, output_ref, flow.step_names)
        refused = ctx.pending_writes()
        if not refused:
            # Nothing to write: the step's events wait for the next commit of this
            # attempt (a step's writes, an effect's claim or result, the ack or failure).
            return
        try:
            ctx.commit_now(refused=refused)
        except BaseException as error_raised:
            # The commit itself failed (a version conflict, a stale fencing token, a lost
            # lease): nothing of the step was written; keep its events and say why. The
            # step did not finish with success: its end comes after the refusal.
            if isinstance(error_raised, LeaseLostError):
                ctx.record_fenced(refused, step_name=name)
            ctx._discard_step_writes(None)
            ctx.unrecord(finished)
            error = ctx.redactor.error(error_raised)
            ctx.record("step.rolled_back", status="fail", step_name=name, error=error)
            ctx.record(
                "step.finished", status="fail", step_name=name, duration=duration, error=error
            )
            ctx.commit_now(failed=True)
            raise
