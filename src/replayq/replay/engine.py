"""The replay engine: trace replay, deterministic dry-run, forked re-execution, guarded rerun.

* ``trace_replay`` executes nothing: the recorded timeline of every attempt.
* ``dry_run`` runs the handler again; calls, effects, clock/random and cache
  reads come from the recording, state reads are the versions the attempt read,
  writes go to a throw-away branch. The run is compared with the recording event
  by event and the first divergence is reported.
* ``fork`` branches the state as it was before a step, runs a chosen handler
  version from there on the branch, and records a trace of its own linked to
  the original.
* ``rerun`` re-executes against the real world with an allowlist of effect
  kinds (see ``replayq.replay.rerun``).

Every derived trace is tagged with its origin, kept out of the job's own
timeline and of production listings, and linked to its source in ``rq_lineage``.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import (
    ConfigurationError,
    EffectInDoubtError,
    JobError,
    RecordedFailure,
    ReplayDivergenceError,
    classify,
)
from replayq.model import TraceEvent
from replayq.queue.handlers import Handler, PayloadShape
from replayq.recording.attempt import Refusal
from replayq.recording.context import Context
from replayq.replay.decision import contract_decision, recorded_decision
from replayq.replay.recorded import Outcome, RecordedWorld, Recording, load_recording
from replayq.runtime import Runtime, RuntimeSource
from replayq.seal import SealReport, Violation, seal
from replayq.storage.protocol import BranchCreate, LineagePut, TraceQuery, Transaction

REPLAY_WORKER = "replay"


@dataclass(frozen=True)
class Divergence:
    """Where a re-execution first parted from the recording."""

    index: int
    step: str | None
    recorded_seq: int | None
    now_seq: int | None
    recorded: dict[str, Any] | None
    now: dict[str, Any] | None
    reason: str


@dataclass
class ReplayReport:
    """What a dry-run or fork did, and how it compares with the recording."""

    mode: str
    job_id: int
    attempt: int
    trace_id: str
    source_trace_id: str
    version: str
    branch: str
    outcome_recorded: Outcome
    outcome_now: Outcome
    first_divergence: Divergence | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    state_writes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    fork_step: str | None = None
    reached_fork: bool | None = None
    retry_recorded: str | None = None
    retry_now: str | None = None
    unrecorded_io: list[str] = field(default_factory=list)
    allowed_io: list[str] = field(default_factory=list)
    allow_io: bool = False

    @property
    def outcome_divergence(self) -> str | None:
        """How the outcome (status, failure class, message, retry decision) differs, if it does."""
        a, b = self.outcome_recorded, self.outcome_now
        if a.status != b.status:
            return f"recorded {a.status}, now {b.status}"
        if a.status == "failed":
            if a.error_class != b.error_class:
                return f"recorded failure class {a.error_class}, now {b.error_class}"
            if a.error != b.error:
                return f"recorded error {a.error!r}, now {b.error!r}"
        if self.retry_recorded and self.retry_now and self.retry_recorded != self.retry_now:
            return f"recorded decision {self.retry_recorded!r}, now {self.retry_now!r}"
        return None

    @property
    def diverged(self) -> bool:
        return (
            self.first_divergence is not None
            or bool(self.unrecorded_io)
            or self.outcome_divergence is not None
            or bool(self.decisions)
            or bool(self.state_writes)
        )

    def to_dict(self) -> dict[str, Any]:
        body = {k: v for k, v in vars(self).items() if k not in ("outcome_recorded", "outcome_now")}
        body["outcome_recorded"] = self.outcome_recorded.to_dict()
        body["outcome_now"] = self.outcome_now.to_dict()
        body["first_divergence"] = vars(self.first_divergence) if self.first_divergence else None
        body["outcome_divergence"] = self.outcome_divergence
        body["diverged"] = self.diverged
        return body


def signature(event: TraceEvent) -> tuple[Any, ...] | None:
    """What must match between a recorded and a replayed event (``None``: not compared)."""
    name, data = event.name, event.data
    if name == "step.started":
        return ("step", data.get("step_name"))
    if name == "step.finished":
        return ("step.end", data.get("step_name"), event.status)
    if name == "step.skipped":
        return ("step.skipped", data.get("step_key"), data.get("completed_in"))
    if name == "decision":
        return ("decision", data.get("decision"), codec.dumps(data.get("value")))
    if name == "call":
        return ("call", data.get("call"), data.get("fingerprint"))
    if name in ("effect.succeeded", "effect.deduplicated", "effect.replayed", "effect.failed"):
        return ("effect", data.get("kind"), data.get("key"))
    if name == "state.read":
        return ("state.read", event.resource, event.resource_version)
    if name == "state.write":
        return ("state.write", event.resource, codec.dumps(data.get("delta")))
    if name in ("clock.now", "random.random", "random.uuid"):
        return (name,)
    if name == "cache.read":
        return ("cache.read", data.get("key"), data.get("hit"))
    if name in ("cache.write", "cache.invalidate"):
        return (name, data.get("key"))
    if name == "outbox.written":
        return ("outbox", data.get("topic"), codec.dumps(data.get("payload")))
    if name == "child.enqueued":
        return ("child", data.get("child_type"), codec.dumps(data.get("payload")))
    if name in ("lock.acquired", "lock.released", "lock.expired", "lock.timeout"):
        return ("lock", event.resource, name.removeprefix("lock."))
    if name == "state.write_rejected":
        return ("state.write_rejected", event.resource)
    return None


def _describe(event: TraceEvent) -> dict[str, Any]:
    return {
        "name": event.name,
        "seq": event.seq,
        "step": event.step,
        "resource": event.resource,
        "version": event.resource_version,
        "status": event.status,
        "data": {k: v for k, v in event.data.items() if k not in ("read", "replayed")},
    }


def _step_of(event: TraceEvent) -> str | None:
    """The step an event belongs to; a step boundary (recorded outside it) names its own step."""
    if event.step is None and event.name in ("step.started", "step.finished", "step.skipped"):
        name = event.data.get("step_name")
        return str(name) if name is not None else None
    return event.step


def first_divergence(recorded: list[TraceEvent], now: list[TraceEvent]) -> Divergence | None:
    """Compare two event sequences on their signatures; the first mismatch, if any."""
    left = [(e, s) for e in recorded if (s := signature(e)) is not None]
    right = [(e, s) for e in now if (s := signature(e)) is not None]
    for index in range(max(len(left), len(right))):
        a = left[index] if index < len(left) else None
        b = right[index] if index < len(right) else None
        if a is not None and b is not None and a[1] == b[1]:
            continue
        if a is None:
            reason = "the re-execution did more than the recording"
        elif b is None:
            reason = "the re-execution stopped before the recording did"
        else:
            reason = f"recorded {a[1][0]} {a[1][1:]!r}, now {b[1][0]} {b[1][1:]!r}"
        return Divergence(
            index=index,
            step=(_step_of(a[0]) if a else None) or (_step_of(b[0]) if b else None),
            recorded_seq=a[0].seq if a else None,
            now_seq=b[0].seq if b else None,
            recorded=_describe(a[0]) if a else None,
            now=_describe(b[0]) if b else None,
            reason=reason,
        )
    return None


def _pairs(events: list[TraceEvent], name: str, key: Callable[[TraceEvent], Any]) -> dict[Any, Any]:
    found: dict[Any, Any] = {}
    for event in events:
        if event.name == name:
            found.setdefault(key(event), []).append(event)
    return found


def compare_decisions(recorded: list[TraceEvent], now: list[TraceEvent]) -> list[dict[str, Any]]:
    """Decisions whose values differ (by name, in order)."""
    a = _pairs(recorded, "decision", lambda e: e.data.get("decision"))
    b = _pairs(now, "decision", lambda e: e.data.get("decision"))
    out = []
    for name in sorted(set(a) | set(b), key=str):
        va = [e.data.get("value") for e in a.get(name, [])]
        vb = [e.data.get("value") for e in b.get(name, [])]
        if va != vb:
            out.append({"decision": name, "recorded": va, "now": vb})
    return out


def compare_writes(recorded: list[TraceEvent], now: list[TraceEvent]) -> list[dict[str, Any]]:
    """State writes whose deltas differ (by resource)."""
    a = _pairs(recorded, "state.write", lambda e: e.resource)
    b = _pairs(now, "state.write", lambda e: e.resource)
    out = []
    for resource in sorted(set(a) | set(b), key=str):
        da = [e.data.get("delta") for e in a.get(resource, [])]
        db = [e.data.get("delta") for e in b.get(resource, [])]
        if da != db:
            out.append({"resource": resource, "recorded": da, "now": db})
    return out


def load_handler_spec(spec: str, template: Handler) -> Handler:
    """A ``module:function`` handler run under the recorded job's contract."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{spec!r}: use module:function")
    fn = getattr(importlib.import_module(module_name), attribute)
    contract = template.contract
    from dataclasses import replace

    return Handler(replace(contract, version=spec), fn, PayloadShape.from_function(fn), {})


def choose_handler(
    source: RuntimeSource, recording: Recording, version: str | None, handler_spec: str | None
) -> Handler:
    runtime = source.runtime
    job = recording.job
    recorded = runtime.registry.handler(job.job_type, job.handler_version)
    if handler_spec:
        return load_handler_spec(handler_spec, recorded)
    return runtime.registry.handler(job.job_type, version or job.handler_version)


def _names(origin: str) -> tuple[str, str]:
    """A new derived trace id and its branch."""
    trace_id = f"{origin}-{uuid.uuid4().hex[:16]}"
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
) -> None:
    """The derived trace's branch and lineage rows."""
    now = runtime.clock.now()
    tx.branch_create(BranchCreate(branch, "main", base_hlc, origin, now))
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
    trace_id, branch = _names(origin)
    with runtime.storage.transaction() as tx:
        _write_begin(tx, runtime, recording, origin, base_hlc, details, trace_id, branch)
    return trace_id, branch


class BufferedContext(Context):
    """A dry-run's context: each step's commit is kept in memory, not written.

    The engine compares the kept events with the recording and writes them, the
    branch's state and the lineage in one transaction at the end (or, with
    ``keep=False``, never). A dry-run's branch is its own: nothing else writes it,
    so the compare-and-set checks at the end see what they would have seen per step.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept_writes: list[Callable[[Transaction], None]] = []
        self.kept_events: list[TraceEvent] = []

    def reads_commit_events(self) -> bool:
        return False

    def commit_now(self, *, failed: bool = False) -> None:
        if not failed:
            # What the recorded commit refused is refused here, at the step's commit.
            for write in self.pending_write_calls():
                if isinstance(write, Refusal):
                    write(None)
        writes, events = self.take_pending(failed=failed)
        self.kept_writes.extend(writes)
        self.kept_events.extend(events)


def _execute(ctx: Context) -> Outcome:
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
        failure = classify(exc, dict(ctx.handler.error_map))
        if isinstance(exc, JobError):
            failure = exc.failure_class
        return Outcome("failed", error_class=failure.value, error=f"{type(exc).__name__}: {exc}")
    ctx.commit_now()
    return Outcome("succeeded", result=result)


def _finished(runtime: Runtime, trace_id: str, outcome: Outcome, origin: str) -> TraceEvent:
    return TraceEvent(
        trace_id=trace_id,
        name=f"{origin}.finished",
        kind="domain",
        ts=runtime.clock.now(),
        hlc=runtime.hlc.tick(),
        worker_id=REPLAY_WORKER,
        status=outcome.status,
        data=outcome.to_dict(),
    )


def _finish(runtime: Runtime, trace_id: str, outcome: Outcome, origin: str) -> None:
    with runtime.storage.transaction() as tx:
        tx.trace_append([_finished(runtime, trace_id, outcome, origin)])


def _run_derived(
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
) -> ReplayReport:
    """Run ``handler`` against the recording on a branch of its own and compare.

    ``buffered`` (dry-run): the steps' commits stay in memory, the comparison is made
    from them, and the derived trace, the branch's state and the lineage are written
    in one transaction at the end — or not at all with ``keep=False``.
    """
    details = {
        "attempt": recording.attempt,
        "version": handler.contract.version,
        "fork_step": fork_step,
        "overrides": overrides,
    }
    if buffered:
        trace_id, branch = _names(origin)
    else:
        trace_id, branch = _begin(runtime, recording, origin, base_hlc, details)
    answers = RecordedWorld(recording, fork_step=fork_step, stubs=stubs)
    job = recording.job.evolve(
        attempt=recording.attempt,
        payload={**recording.job.payload, **overrides},
        origin=origin,
    )
    ctx = (BufferedContext if buffered else Context)(
        runtime,
        job,
        handler,
        worker_id=REPLAY_WORKER,
        branch=branch,
        world=answers,
        trace_id=trace_id,
        namespace=branch,
        branch_base=("main", base_hlc) if buffered else None,
    )
    error = None
    with seal(step=lambda: ctx.current_step, allow_io=allow_io) as sealed:
        try:
            outcome = _execute(ctx)
        except ReplayDivergenceError as exc:
            error = str(exc)
            ctx.record("replay.denied", status="fail", error=error)
            ctx.discard_writes()
            ctx.commit_now(failed=True)
            outcome = Outcome("failed", error_class="replay", error=error)
    if isinstance(ctx, BufferedContext):
        unrecorded = list(sealed.violations)
        ctx.kept_events.extend(_unrecorded_events(ctx, sealed))
        now_events = list(ctx.kept_events)
        if keep:
            with runtime.storage.transaction() as tx:
                _write_begin(tx, runtime, recording, origin, base_hlc, details, trace_id, branch)
                for write in ctx.kept_writes:
                    write(tx)
                tx.trace_append([*now_events, _finished(runtime, trace_id, outcome, origin)])
    else:
        unrecorded = _record_unrecorded_io(runtime, ctx, sealed)
        _finish(runtime, trace_id, outcome, origin)
        with runtime.storage.transaction(readonly=True) as tx:
            now_events = [
                e
                for e in tx.trace_query(TraceQuery(trace_id=trace_id))
                if e.name != f"{origin}.finished"
            ]
    recorded = recording.events
    if fork_step is not None:
        # Compare only from the fork point on; before it the fork used the recording.
        recorded = _from_step(recorded, fork_step)
        now_events = _from_step(now_events, fork_step)
    report = ReplayReport(
        mode=origin,
        job_id=recording.job.id,
        attempt=recording.attempt,
        trace_id=trace_id,
        source_trace_id=recording.job.trace_id,
        version=handler.contract.version,
        branch=branch,
        outcome_recorded=recording.outcome,
        outcome_now=outcome,
        first_divergence=first_divergence(recorded, now_events),
        decisions=compare_decisions(recorded, now_events),
        state_writes=compare_writes(recorded, now_events),
        error=error,
        fork_step=fork_step,
        reached_fork=answers.reached_fork if fork_step else None,
        unrecorded_io=[str(v) for v in unrecorded if not v.allowed],
        allowed_io=[str(v) for v in unrecorded if v.allowed],
        allow_io=allow_io,
    )
    if recording.outcome.status == "failed":
        report.retry_recorded = recorded_decision(recording.lifecycle, recording.job.max_attempts)
    if outcome.status == "failed" and outcome.error_class != "replay":
        report.retry_now = contract_decision(
            handler.contract,
            outcome.error_class,
            recording.attempt,
            in_doubt=(outcome.error or "").startswith(EffectInDoubtError.__name__),
        )
    if report.unrecorded_io:
        # I/O that bypassed ctx is the divergence that matters most: name it first.
        first = next(v for v in unrecorded if not v.allowed)
        report.first_divergence = Divergence(0, first.step, None, None, None, None, str(first))
    elif error and report.first_divergence is None:
        report.first_divergence = Divergence(0, ctx.current_step, None, None, None, None, error)
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


def _from_step(events: list[TraceEvent], step: str) -> list[TraceEvent]:
    for index, event in enumerate(events):
        if event.name == "step.started" and event.data.get("step_name") == step:
            return events[index:]
    return []


def dry_run(
    source: RuntimeSource,
    job_id: int,
    *,
    attempt: int | None = None,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
    keep: bool = True,
) -> ReplayReport:
    """Re-run a recorded attempt with every external answer from the recording.

    The handler runs sealed: I/O that bypasses ``ctx`` (sockets, host names,
    subprocesses, file writes outside the run's temporary directory) is refused
    with ``UnrecordedIOError`` and reported as the first divergence.
    ``allow_io=True`` lets it happen and still lists it.

    The recording (job, events, blobs, the state versions the attempt read) is
    loaded in one read transaction; the run commits nothing per step; the derived
    trace, its branch's state and lineage are written in one transaction at the end.
    ``keep=False`` writes nothing at all (bulk verification): the report is the result.
    """
    runtime = source.runtime
    recording = load_recording(runtime, job_id, attempt)
    chosen = choose_handler(runtime, recording, version, handler)
    return _dry_run_recording(runtime, recording, chosen, allow_io=allow_io, keep=keep)


def _dry_run_recording(
    runtime: Runtime, recording: Recording, chosen: Handler, *, allow_io: bool, keep: bool
) -> ReplayReport:
    return _run_derived(
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
    )


def dry_run_many(
    source: RuntimeSource,
    job_ids: Sequence[int],
    *,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
    keep: bool = True,
    processes: int = 1,
) -> list[ReplayReport]:
    """``dry_run`` of each job (its last recorded attempt), reports in the order given.

    One handler is chosen per (job type, recorded version) and reused; the runs share
    this thread's connection. ``processes > 1`` splits the jobs over forked processes
    (POSIX), each with its own connection — only when this process runs no other
    thread (a fork copies locks other threads hold); otherwise the jobs run here, one
    after the other. ``keep=False`` writes nothing.
    """
    runtime = source.runtime
    ids = list(job_ids)
    # Forking a process that runs other threads can copy a lock one of them holds into a
    # child that then waits for it forever: fork only from a single-threaded process.
    if processes > 1 and len(ids) > 1 and threading.active_count() == 1:
        return _dry_run_forked(runtime, ids, version, handler, allow_io, keep, processes)
    chosen: dict[tuple[str, str | None], Handler] = {}
    reports = []
    for job_id in ids:
        recording = load_recording(runtime, job_id)
        which = (recording.job.job_type, recording.job.handler_version)
        if which not in chosen:
            chosen[which] = choose_handler(runtime, recording, version, handler)
        reports.append(
            _dry_run_recording(runtime, recording, chosen[which], allow_io=allow_io, keep=keep)
        )
    return reports


_FORKED: dict[str, Any] = {}


def _dry_run_chunk(ids: list[int]) -> list[ReplayReport]:
    """In a forked process: a runtime with connections of its own (never the parent's)."""
    parent: Runtime = _FORKED["runtime"]
    own = dataclasses.replace(parent, _opened=type(parent._opened)())
    try:
        return dry_run_many(own, ids, **_FORKED["options"])
    finally:
        own.close()


def _dry_run_forked(
    runtime: Runtime,
    ids: list[int],
    version: str | None,
    handler: str | None,
    allow_io: bool,
    keep: bool,
    processes: int,
) -> list[ReplayReport]:
    import multiprocessing

    _FORKED["runtime"] = runtime
    _FORKED["options"] = {
        "version": version,
        "handler": handler,
        "allow_io": allow_io,
        "keep": keep,
    }
    size = -(-len(ids) // processes)
    chunks = [ids[n : n + size] for n in range(0, len(ids), size)]
    try:
        with multiprocessing.get_context("fork").Pool(len(chunks)) as pool:
            return [report for part in pool.map(_dry_run_chunk, chunks) for report in part]
    finally:
        _FORKED.clear()


def fork(
    source: RuntimeSource,
    job_id: int,
    *,
    from_step: str,
    attempt: int | None = None,
    version: str | None = None,
    handler: str | None = None,
    overrides: dict[str, Any] | None = None,
    stubs: dict[str, Any] | None = None,
    allow_io: bool = False,
) -> ReplayReport:
    """Branch the state as it was before ``from_step`` and run the chosen code from there.

    Sealed like ``dry_run``: I/O that bypasses ``ctx`` is refused and reported.
    """
    runtime = source.runtime
    recording = load_recording(runtime, job_id, attempt)
    starts = [
        e
        for e in recording.events
        if e.name == "step.started" and e.data.get("step_name") == from_step
    ]
    if not starts:
        steps = sorted(
            {str(e.data.get("step_name")) for e in recording.events if e.name == "step.started"}
        )
        raise ConfigurationError(
            f"job {job_id} attempt {recording.attempt} has no step {from_step!r}; "
            f"recorded steps: {', '.join(steps) or 'none'}"
        )
    chosen = choose_handler(runtime, recording, version, handler)
    return _run_derived(
        runtime,
        recording,
        chosen,
        origin="fork",
        fork_step=from_step,
        overrides=overrides or {},
        stubs=stubs or {},
        base_hlc=starts[0].hlc - 1,
        allow_io=allow_io,
    )


@dataclass(frozen=True)
class AttemptTimeline:
    attempt: int
    worker_id: str | None
    events: list[TraceEvent]
    side_effect_steps: list[str]


def trace_replay(source: RuntimeSource, job_id: int) -> list[AttemptTimeline]:
    """The recorded timeline of every attempt of a job; executes nothing."""
    with source.runtime.storage.transaction(readonly=True) as tx:
        events = tx.trace_query(TraceQuery(job_id=job_id))
    attempts: dict[int, list[TraceEvent]] = {}
    for event in events:
        attempts.setdefault(event.attempt or 0, []).append(event)
    timelines = []
    for number in sorted(attempts):
        chunk = attempts[number]
        workers = [e.worker_id for e in chunk if e.name == "job.leased"]
        effects = sorted({e.step or "(no step)" for e in chunk if e.side_effect})
        timelines.append(AttemptTimeline(number, workers[0] if workers else None, chunk, effects))
    return timelines
