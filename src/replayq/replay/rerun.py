"""Guarded real re-execution (``replayq rerun``): the real world, effect kind by effect kind.

A rerun executes a job's handler again against production state and real
services, in-process, with guardrails:

* only effect kinds named in ``allow_effects`` run for real; any other effect
  returns its recorded result if the recording has one, and is refused
  (``EffectRefusedError``, reported) if not (the ``GatedWorld``);
* idempotency records are honoured: an allowed effect whose key already
  succeeded is not repeated (the normal ``ctx.effect`` path);
* locks are taken as in a worker; state writes are real and fenced;
* a rate limit spaces bulk reruns: the handlers' starts, after each has read its
  recording, so the real services see the spacing even when reading is slow.

A rerun never changes the original job row; its trace is tagged ``rerun`` and
linked to the original. Never the default: the caller must name the kinds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import ConfigurationError, EffectRefusedError
from replayq.model import TraceEvent
from replayq.recording.context import Context
from replayq.recording.world import LIVE, LiveWorld
from replayq.replay.hold import held
from replayq.replay.recorded import EFFECT_OUTCOMES, Outcome, failed_outcome, load_recording
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.protocol import LineagePut


class GatedWorld(LiveWorld):
    """The real world, effect kind by effect kind: a rerun's ``World``.

    Calls, clock and random reads, state and locks are real. An effect of an
    allowed kind runs for real (behind its idempotency record, as in a worker);
    any other effect returns its recorded result, or is refused.
    """

    def __init__(self, allowed: Sequence[str], recorded: dict[str, list[Any]]) -> None:
        super().__init__()
        self.allowed = set(allowed)
        self._recorded = {kind: list(values) for kind, values in recorded.items()}
        self.refused: list[str] = []
        self.substituted: list[str] = []

    def answer(self, name: str, label: str, fingerprint: str) -> Any:
        if name != "effect" or label in self.allowed:
            return LIVE
        values = self._recorded.get(label)
        if values:
            self.substituted.append(label)
            return values.pop(0)
        self.refused.append(label)
        raise EffectRefusedError(
            f"effect {label!r} (key {fingerprint!r}) is not in --allow-effects and the recording "
            "has no result for it; refused"
        )


@dataclass
class RerunReport:
    job_id: int
    trace_id: str
    outcome: Outcome
    allowed: list[str]
    substituted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        body = dict(vars(self))
        body["outcome"] = self.outcome.to_dict()
        return body


def rerun(source: RuntimeSource, job_id: int, *, allow_effects: Sequence[str]) -> RerunReport:
    """Re-execute one job for real with only ``allow_effects`` kinds running."""
    runtime = source.runtime
    _require_named_effects(allow_effects)
    return _rerun(runtime, job_id, allow_effects, _start_now)


def _require_named_effects(allow_effects: Sequence[str]) -> None:
    if not allow_effects:
        raise ConfigurationError(
            "a rerun touches the real world: name the effect kinds it may run (--allow-effects)"
        )


def _start_now() -> None:
    """A single rerun starts as soon as its recording is read."""


def _rerun(
    runtime: Runtime,
    job_id: int,
    allow_effects: Sequence[str],
    wait_for_start: Callable[[], None],
) -> RerunReport:
    # Held against gc while it runs: it appends to the job's trace.
    with held(runtime, job_id, "rerun"):
        return _run_held(runtime, job_id, allow_effects, wait_for_start)


def _run_held(
    runtime: Runtime,
    job_id: int,
    allow_effects: Sequence[str],
    wait_for_start: Callable[[], None],
) -> RerunReport:
    recording = load_recording(runtime, job_id)
    recorded: dict[str, list[Any]] = {}
    for event in recording.events:
        if event.name in EFFECT_OUTCOMES:
            recorded.setdefault(str(event.data.get("kind")), []).append(
                recording.value(event, "result")
            )
    gate = GatedWorld(allow_effects, recorded)
    trace_id = f"rerun-{uuid.uuid4().hex[:16]}"
    wait_for_start()
    now = runtime.clock.now()
    with runtime.storage.transaction() as tx:
        tx.lineage_put(
            LineagePut(
                trace_id=trace_id,
                origin="rerun",
                source_trace_id=recording.job.trace_id,
                source_job_id=job_id,
                branch="main",
                details=codec.dumps({"allow_effects": list(allow_effects)}),
                now=now,
            )
        )
    handler = runtime.registry.handler(recording.job.job_type)
    job = recording.job.evolve(origin="rerun", attempt=recording.job.attempt + 1)
    ctx = Context(runtime, job, handler, worker_id="rerun", trace_id=trace_id, world=gate)
    # Released on every path, a failed commit's too (``run`` ended it at the handler's return).
    try:
        try:
            result = ctx.run()
            ctx.commit_now()
            outcome = Outcome("succeeded", result=result)
        except Exception as exc:
            ctx.discard_writes()
            ctx.commit_now(failed=True)
            # As the worker records it: replayq's own table refusing a write (a rerun's
            # state writes are real) is replayq's bug, not the contract's class.
            outcome = failed_outcome(exc, dict(handler.error_map), ctx.redactor)
    finally:
        ctx.release()
    with runtime.storage.transaction() as tx:
        tx.trace_append(
            [
                TraceEvent(
                    trace_id=trace_id,
                    name="rerun.finished",
                    kind="domain",
                    ts=runtime.clock.now(),
                    hlc=runtime.hlc.tick(),
                    worker_id="rerun",
                    status=outcome.status,
                    data=ctx.redactor.value(outcome.to_dict()),  # as any event's data
                )
            ]
        )
    return RerunReport(
        job_id, trace_id, outcome, list(allow_effects), gate.substituted, gate.refused
    )


def rerun_many(
    source: RuntimeSource,
    job_ids: Sequence[int],
    *,
    allow_effects: Sequence[str],
    rate: float | None,
    progress: Callable[[int], None] | None = None,
) -> list[RerunReport]:
    """Rerun several jobs, at most ``rate`` per second; ``progress`` is told of each one done.

    The limit spaces the reruns' starts — each taken once its recording is read, just
    before its lineage row and its handler — at least ``1 / rate`` seconds apart.
    """
    runtime = source.runtime
    _require_named_effects(allow_effects)
    limiter = _StartSpacing(1.0 / rate if rate else 0.0)
    reports = []
    for job_id in job_ids:
        reports.append(_rerun(runtime, job_id, allow_effects, limiter.wait))
        if progress is not None:
            progress(1)
    return reports


class _StartSpacing:
    """Starts at least ``interval`` seconds apart on the monotonic clock."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: float | None = None

    def wait(self) -> None:
        if self._next is not None:
            delay = self._next - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self._next = time.monotonic() + self.interval
