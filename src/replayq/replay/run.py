"""Running a handler against a recording: the derived trace, its branch, the seal around it.

``run_derived`` is what dry-run and fork share: a ``Context`` whose world is the
recording (``RecordedWorld``), a branch of its own, the seal around the handler
(``replayq.seal``: I/O that bypasses ``ctx`` is refused), and the comparison with
the recording. A dry-run's context (``BufferedContext``) commits nothing per step:
its commits stay in memory and are compared with the recording as they are made;
the derived trace, the branch's state and the lineage row are written in one
transaction at the end, or not at all with ``keep=False``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from replayq import codec
from replayq.errors import (
    INTERNAL_ERROR_PREFIX,
    ConfigurationError,
    ConstraintViolationError,
    EffectInDoubtError,
    RecordedFailure,
    ReplayDivergenceError,
    internal_error_message,
    internal_violation,
)
from replayq.model import Job, TraceEvent
from replayq.queue.contracts import JobContract
from replayq.queue.handlers import Handler, PayloadShape
from replayq.recording.attempt import Refusal
from replayq.recording.context import Context
from replayq.recording.state import StateWrite, branch_with_writes
from replayq.redaction import Redactor
from replayq.replay.compare import (
    Comparison,
    Divergence,
    ReplayReport,
    compare_outcomes,
    first_divergence,
    from_step,
)
from replayq.replay.decision import contract_decision, recorded_decision
from replayq.replay.recorded import (
    Outcome,
    RecordedWorld,
    Recording,
    as_redacted_now,
    failed_outcome,
    with_resources_redacted,
)
from replayq.runtime import Runtime, RuntimeSource
from replayq.seal import SealReport, Violation, seal
from replayq.storage.protocol import BranchCreate, LineagePut, TraceQuery, Transaction

REPLAY_WORKER = "replay"


def load_handler_spec(spec: str, template: Handler) -> Handler:
    """A ``module:function`` handler run under the recorded job's contract and redaction
    rules (what its run records and reports is redacted as the job type's is)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{spec!r}: use module:function")
    fn = getattr(importlib.import_module(module_name), attribute)
    contract = template.contract
    shape = PayloadShape.from_function(fn)
    return Handler(replace(contract, version=spec), fn, shape, {}, template.redactor)


def choose_handler(
    source: RuntimeSource, recording: Recording, version: str | None, handler_spec: str | None
) -> Handler:
    runtime = source.runtime
    job = recording.job
    recorded = runtime.registry.handler(job.job_type, job.handler_version)
    if handler_spec:
        return load_handler_spec(handler_spec, recorded)
    return runtime.registry.handler(job.job_type, version or job.handler_version)


def derived_names(origin: str) -> tuple[str, str]:
    """A new derived trace id and its branch."""
    # ``uuid.uuid4().hex[:16]``: its first 8 random bytes, the version nibble ("4") set,
    # without the ``UUID`` object and its 16 bytes' integer arithmetic.
    head = bytearray(os.urandom(8))
    head[6] = head[6] & 0x0F | 0x40
    trace_id = f"{origin}-{head.hex()}"
    return trace_id, f"{origin}:{trace_id}"


def _write_begin(
    tx: Transaction,
    runtime: Runtime,
    recording: Recording,
    origin: str,
    base_hlc: int,
    details: dict[str, Any],
    trace_id: str,
    branch: str,
    state: Sequence[StateWrite] = (),
) -> None:
    """The derived trace's branch (with the ``state`` a dry-run wrote on it) and lineage rows."""
    now = runtime.clock.now()
    branch_with_writes(tx, BranchCreate(branch, "main", base_hlc, origin, now), state)
    tx.lineage_put(
        LineagePut(
            trace_id=trace_id,
            origin=origin,
            source_trace_id=recording.job.trace_id,
            source_job_id=recording.job.id,
            branch=branch,
            details=codec.dumps(details),
            now=now,
        )
    )


def _begin(
    runtime: Runtime, recording: Recording, origin: str, base_hlc: int, details: dict[str, Any]
) -> tuple[str, str]:
    """Create the derived trace's branch and lineage row."""
    trace_id, branch = derived_names(origin)
    with runtime.storage.transaction() as tx:
        _write_begin(tx, runtime, recording, origin, base_hlc, details, trace_id, branch)
    return trace_id, branch


class BufferedContext(Context):
    """A dry-run's context: each step's commit is kept in memory, not written.

    Each commit's events are compared with the recording as the run makes them
    (``comparison``). The engine writes the kept events, the branch's state and the
    lineage in one transaction at the end (or, with ``keep=False``, never). A dry-run's
    branch is its own: nothing else writes it, so the compare-and-set checks at the end
    see what they would have seen per step.
    """

    def __init__(self, *args: Any, comparison: Comparison, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comparison = comparison
        self.kept_writes: list[Callable[[Transaction], None]] = []
        self.kept_events: list[TraceEvent] = []
        # What waits for a commit outside the database (cache entries): after the end's write.
        self.kept_after: list[Callable[[], None]] = []

    def committed(self) -> None:
        if self._cache is not None:
            self.kept_after.extend(self._cache.take_after_commit())
        super().committed()

    def commit_now(self, *, failed: bool = False, refused: list[str] | None = None) -> None:
        if not failed:
            # What the recorded commit refused is refused here, at the step's commit.
            for write in self.pending_write_calls():
                if isinstance(write, Refusal):
                    write(None)
        writes, events = self.take_pending(failed=failed)
        self.kept_writes.extend(writes)
        self.kept_events.extend(events)
        self.comparison.add(events)

    def release(self) -> None:
        """Drop what refers back to this context once the run is over: the views built in
        it and the kept writes (closures over the context and its views). Without these
        cycles a finished dry-run is freed at once instead of by the cyclic garbage
        collector (whose collections, scanning every report kept so far, took about a
        quarter of a 1,000-job bulk dry-run)."""
        self.kept_writes = []
        super().release()


@dataclass
class Kept:
    """A kept dry-run's end write (its derived trace, branch state and lineage), what runs
    after it commits (cache writes), and the report a refusal of the write is told to."""

    write: Callable[[Transaction], None]
    after: list[Callable[[], None]]
    redactor: Redactor
    contract: JobContract
    report: ReplayReport | None = None

    def refused(self, violation: ConstraintViolationError) -> None:
        """The write was refused by a constraint of replayq's own tables (a bug of
        replayq's, ``internal_violation``): the report says so as a fork's says it of a
        step's commit refused so — failed, class ``unknown``, ``dead: internal_error`` —
        and that nothing of the run was kept. Its ``trace_id`` and ``branch`` name nothing."""
        report = self.report
        assert report is not None
        ran = report.outcome_now
        had = f"; the run had failed: {ran.error}" if ran.status == "failed" else ""
        error = (
            f"{internal_error_message(violation)}; the dry-run's end write was refused, "
            f"not kept: its derived trace, branch and lineage{had}"
        )
        report.outcome_now = Outcome(
            "failed", error_class="unknown", error=self.redactor.text(error)
        )
        report.retry_now = contract_decision(
            self.contract, "unknown", report.attempt, internal=True
        )


@dataclass
class Deferred:
    """The end writes of kept dry-runs, committed together, and what runs after the commit."""

    kept: list[Kept] = field(default_factory=list)

    def commit(self, runtime: Runtime) -> None:
        """Commit the kept writes in one transaction, then run what waits for them.

        A refusal by a constraint of replayq's own tables is reported, not raised (as the
        worker parks an attempt whose settle it refuses, ``Outcomes._park``): each write is
        tried again on its own, and each one refused again tells its report (``Kept.refused``)
        and runs nothing after. Any other error is raised, as before."""
        kept, self.kept = self.kept, []
        if not kept:
            return
        try:
            _commit(runtime, kept)
        except ConstraintViolationError as refused:
            violation = internal_violation(refused)
            if violation is None:
                raise
            if len(kept) == 1:
                kept[0].refused(violation)
                return
            for one in kept:
                try:
                    _commit(runtime, [one])
                except ConstraintViolationError as again:
                    violation = internal_violation(again)
                    if violation is None:
                        raise
                    one.refused(violation)
                    continue
                for action in one.after:
                    action()
            return
        for one in kept:
            for action in one.after:
                action()


def _commit(runtime: Runtime, kept: list[Kept]) -> None:
    with runtime.storage.transaction() as tx:
        for one in kept:
            one.write(tx)


def execute(ctx: Context) -> Outcome:
    try:
        result = ctx.run()
    except ReplayDivergenceError:
        raise
    except Exception as exc:
        ctx.discard_writes()
        ctx.commit_now(failed=True)
        if isinstance(exc, RecordedFailure):
            # The recorded failure, as it was recorded: its class and its message.
            return Outcome("failed", error_class=exc.failure_class.value, error=exc.error)
        return failed_outcome(exc, dict(ctx.handler.error_map), ctx.redactor)
    ctx.commit_now()
    return Outcome("succeeded", result=result)


def _finished(
    runtime: Runtime,
    trace_id: str,
    outcome: Outcome,
    origin: str,
    attempt: int,
    redactor: Redactor,
) -> TraceEvent:
    """The derived trace's last event. It carries the attempt, as the run's events do, so
    that it joins their pack (one ``rq_trace`` row per kept dry-run, not two). Its data,
    the outcome, is redacted as every domain event's is (``Recorder.event``): its messages
    were where they were made (``failed_outcome``), its result, the handler's value, here
    (on its own: a flat result is judged at once, the outcome around it would be encoded
    and screened whole)."""
    now = runtime.clock.now()
    data = outcome.to_dict()
    if outcome.result is not None:
        data["result"] = redactor.value(outcome.result)
    # Every field named (``TraceEvent.built``: no frozen dataclass ``__init__``).
    return TraceEvent.built(
        {
            "trace_id": trace_id,
            "name": f"{origin}.finished",
            "ts": now,
            "hlc": runtime.hlc.tick_at(now),
            "job_id": None,
            "attempt": attempt,
            "kind": "domain",
            "seq": None,
            "step": None,
            "worker_id": REPLAY_WORKER,
            "status": outcome.status,
            "resource": None,
            "resource_version": None,
            "side_effect": False,
            "input_ref": None,
            "output_ref": None,
            "data": data,
            "id": None,
        }
    )


def _finish(
    runtime: Runtime,
    trace_id: str,
    outcome: Outcome,
    origin: str,
    attempt: int,
    redactor: Redactor,
) -> None:
    with runtime.storage.transaction() as tx:
        tx.trace_append([_finished(runtime, trace_id, outcome, origin, attempt, redactor)])


def run_derived(
    runtime: Runtime,
    recording: Recording,
    handler: Handler,
    *,
    origin: str,
    fork_step: str | None,
    overrides: dict[str, Any],
    stubs: dict[str, Any],
    base_hlc: int,
    allow_io: bool,
    buffered: bool = False,
    keep: bool = True,
    deferred: Deferred | None = None,
) -> ReplayReport:
    """Run ``handler`` against the recording on a branch of its own and compare.

    ``buffered`` (dry-run, no fork step): the steps' commits stay in memory and are
    compared with the recording as they are made; the derived trace, the branch's
    state and the lineage are written in one transaction at the end — or not at all
    with ``keep=False``; with ``deferred`` that one write is appended there for the
    caller to commit (a bulk dry-run commits a batch's writes together). That write, once
    the report is made: refused by a constraint of replayq's own tables, the report says
    so and nothing is kept (``Deferred.commit``), nothing is raised. Otherwise
    (fork) each step commits on the branch and the derived trace is read back and
    compared from the fork step on.
    """
    redactor = runtime.redactor_of(handler)
    recording = with_resources_redacted(recording, redactor)
    details = {
        "attempt": recording.attempt,
        "version": handler.contract.version,
        "fork_step": fork_step,
        "overrides": overrides,
    }
    if buffered:
        trace_id, branch = derived_names(origin)
    else:
        trace_id, branch = _begin(runtime, recording, origin, base_hlc, details)
    answers = RecordedWorld(recording, fork_step=fork_step, stubs=stubs, redactor=redactor)
    # ``recording.job.evolve(...)`` without ``dataclasses.replace``'s ``getattr`` and
    # frozen ``__setattr__`` of each of the job's ~30 fields: a copy of its fields.
    job = Job.built(
        {
            **vars(recording.job),
            "attempt": recording.attempt,
            "payload": {**recording.job.payload, **overrides},
            "origin": origin,
        }
    )
    options: dict[str, Any] = {
        "worker_id": REPLAY_WORKER,
        "branch": branch,
        "world": answers,
        "trace_id": trace_id,
        "namespace": branch,
    }
    if buffered:
        comparison = Comparison(recording.events)
        ctx: Context = BufferedContext(
            runtime,
            job,
            handler,
            comparison=comparison,
            branch_base=("main", base_hlc),
            **options,
        )
    else:
        ctx = Context(runtime, job, handler, **options)
    kept: Kept | None = None  # a kept dry-run's end write, committed once its report is made
    # Released on every path: a ctx the handler kept refuses once it returned (``run``
    # ends it), and the views and kept writes that refer back to it are dropped even when
    # what follows the run raises (a comparison). The end's write comes after: its closures
    # hold what they write, as a bulk dry-run's, committed after its batch, always did.
    try:
        error = None
        with seal(step=lambda: ctx.current_step, allow_io=allow_io) as sealed:
            try:
                outcome = execute(ctx)
            except ReplayDivergenceError as exc:
                # Its message can quote what the handler passed (a call's arguments, an
                # effect's key): redacted as the recording's messages are.
                error = ctx.redactor.text(str(exc))
                ctx.record("replay.denied", status="fail", error=error)
                ctx.discard_writes()
                ctx.commit_now(failed=True)
                outcome = Outcome("failed", error_class="replay", error=error)
        recorded = recording.events
        if isinstance(ctx, BufferedContext):
            unrecorded = list(sealed.violations)
            ctx.kept_events.extend(_unrecorded_events(ctx, sealed))
            now_events = ctx.kept_events
            divergence = ctx.comparison.first()
            if keep:
                # The branch is created with the state written on it (``branch_with_writes``:
                # its versions in two statements); the other writes (blobs) go one by one.
                state = [w for w in ctx.kept_writes if isinstance(w, StateWrite)]
                others = [w for w in ctx.kept_writes if not isinstance(w, StateWrite)]
                finished = _finished(runtime, trace_id, outcome, origin, job.attempt, ctx.redactor)
                events = [*now_events, finished]

                def write_all(tx: Transaction) -> None:
                    for write in others:
                        write(tx)
                    _write_begin(
                        tx, runtime, recording, origin, base_hlc, details, trace_id, branch, state
                    )
                    tx.trace_append(events)

                kept = Kept(write_all, list(ctx.kept_after), ctx.redactor, handler.contract)
        else:
            unrecorded = _record_unrecorded_io(runtime, ctx, sealed)
            _finish(runtime, trace_id, outcome, origin, job.attempt, ctx.redactor)
            with runtime.storage.transaction(readonly=True) as tx:
                now_events = [
                    e
                    for e in tx.trace_query(TraceQuery(trace_id=trace_id))
                    if e.name != f"{origin}.finished"
                ]
            if fork_step is not None:
                # Compare only from the fork point on; before it the fork used the recording.
                recorded = from_step(recorded, fork_step)
                now_events = from_step(now_events, fork_step)
            divergence = first_divergence(recorded, now_events)
        if isinstance(ctx, BufferedContext):
            # Every event of ``now_events`` but the ``io.unrecorded`` ones passed through
            # ``comparison.add``: grouped there.
            decisions, state_writes = ctx.comparison.outcomes()
        else:
            decisions, state_writes = compare_outcomes(recorded, now_events)
        report = ReplayReport(
            mode=origin,
            job_id=recording.job.id,
            attempt=recording.attempt,
            trace_id=trace_id,
            source_trace_id=recording.job.trace_id,
            version=handler.contract.version,
            branch=branch,
            # Redacted by the rules the run's outcome was (``as_redacted_now``).
            outcome_recorded=as_redacted_now(recording.outcome, ctx.redactor),
            outcome_now=outcome,
            first_divergence=divergence,
            decisions=decisions,
            state_writes=state_writes,
            error=error,
            fork_step=fork_step,
            reached_fork=answers.reached_fork if fork_step else None,
            # A refused call's target (a subprocess's arguments, say) redacted, as its
            # ``io.unrecorded`` event is.
            unrecorded_io=[ctx.redactor.text(str(v)) for v in unrecorded if not v.allowed],
            allowed_io=[ctx.redactor.text(str(v)) for v in unrecorded if v.allowed],
            allow_io=allow_io,
            events_now=list(now_events),
        )
    finally:
        ctx.release()
    if recording.outcome.status == "failed":
        report.retry_recorded = recorded_decision(recording.lifecycle, recording.job.max_attempts)
    if outcome.status == "failed" and outcome.error_class != "replay":
        report.retry_now = contract_decision(
            handler.contract,
            outcome.error_class,
            recording.attempt,
            in_doubt=(outcome.error or "").startswith(EffectInDoubtError.__name__),
            internal=(outcome.error or "").startswith(INTERNAL_ERROR_PREFIX),
        )
    if report.unrecorded_io:
        # I/O that bypassed ctx is the divergence that matters most: name it first.
        first = next(v for v in unrecorded if not v.allowed)
        reason = report.unrecorded_io[0]  # ``str(first)``, redacted
        report.first_divergence = Divergence(0, first.step, None, None, None, None, reason)
    elif error and report.first_divergence is None:
        report.first_divergence = Divergence(0, ctx.current_step, None, None, None, None, error)
    if kept is not None:
        kept.report = report
        end = deferred if deferred is not None else Deferred()
        end.kept.append(kept)
        if deferred is None:
            end.commit(runtime)
    return report


def _unrecorded_events(ctx: Context, sealed: SealReport) -> list[TraceEvent]:
    """An ``io.unrecorded`` event for each call that bypassed ``ctx``."""
    return [
        ctx.event(
            "io.unrecorded",
            status="allowed" if v.allowed else "fail",
            call=v.call,
            target=v.target,
            at_step=v.step,
            allowed=v.allowed,
        )
        for v in sealed.violations
    ]


def _record_unrecorded_io(runtime: Runtime, ctx: Context, sealed: SealReport) -> list[Violation]:
    """Write each call that bypassed ``ctx`` into the derived trace (``io.unrecorded``)."""
    if not sealed.violations:
        return []
    with runtime.storage.transaction() as tx:
        tx.trace_append(_unrecorded_events(ctx, sealed))
    return list(sealed.violations)


def dry_run_recording(
    runtime: Runtime,
    recording: Recording,
    chosen: Handler,
    *,
    allow_io: bool,
    keep: bool,
    deferred: Deferred | None = None,
) -> ReplayReport:
    """Dry-run a loaded recording with ``chosen`` (see ``replayq.replay.engine.dry_run``)."""
    return run_derived(
        runtime,
        recording,
        chosen,
        origin="replay",
        fork_step=None,
        overrides={},
        stubs={},
        base_hlc=recording.start_hlc,
        allow_io=allow_io,
        buffered=True,
        keep=keep,
        deferred=deferred,
    )
