"""``rollout verify``: a candidate version over recorded attempts of the baseline, sealed.

Each recorded attempt of ``from_version`` is dry-run under ``to_version``: every
outside answer comes from the recording and handler I/O that bypasses ``ctx``
is refused (``replayq.seal``), so nothing real is called. Each attempt is then
compared with its recording and its differences are classed:

=================  ===========================================================
class              differs when
=================  ===========================================================
outcome            succeeded vs failed, or another failure class
retry_decision     the contract's decision after the failure (retry with which
                   ceiling, or dead with which reason)
decision_path      the step sequence or a ``ctx.decide`` value
unrecorded_call    the candidate asked for a call or read the recording lacks
effects            effects intended (kind, key, count)
state              state written, key by key
cache_keys         cache keys written
cache_shape        a value of another shape written under the same cache key
unrecorded_io      handler I/O that bypassed ``ctx`` (refused)
=================  ===========================================================
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from replayq import codec
from replayq.model import TraceEvent
from replayq.replay.engine import ReplayReport, dry_run
from replayq.replay.recorded import attempts_with_events
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import JobFilter, TraceQuery

DIFFERENCE_CLASSES = (
    "outcome",
    "retry_decision",
    "decision_path",
    "unrecorded_call",
    "effects",
    "state",
    "cache_keys",
    "cache_shape",
    "unrecorded_io",
)
_EFFECT_EVENTS = frozenset(
    {
        "effect.succeeded",
        "effect.deduplicated",
        "effect.replayed",
        "effect.failed",
        "effect.refused",
        "effect.in_doubt",
    }
)
EXAMPLES = 10


@dataclass
class AttemptComparison:
    """One recorded attempt against the candidate's sealed run of it."""

    job_id: int
    attempt: int
    classes: list[str]
    details: dict[str, Any]
    first_divergence_step: str | None
    duration_recorded: float | None
    duration_now: float
    fork_command: str

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass
class VerifyReport:
    """Every attempt compared, counted per difference class (``CLASSES``, in report order)."""

    CLASSES: ClassVar[tuple[str, ...]] = DIFFERENCE_CLASSES
    job_type: str
    from_version: str
    to_version: str
    allowed: tuple[str, ...]
    attempts: int = 0
    seconds: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)
    first_divergence_steps: Counter[str] = field(default_factory=Counter)
    comparisons: list[AttemptComparison] = field(default_factory=list)

    @property
    def differing(self) -> list[AttemptComparison]:
        return [c for c in self.comparisons if c.classes]

    @property
    def disallowed(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if k not in self.allowed}

    @property
    def passed(self) -> bool:
        return not self.disallowed

    @property
    def throughput(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0

    def examples(self, limit: int = EXAMPLES) -> list[AttemptComparison]:
        return self.differing[:limit]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_type": self.job_type,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "attempts": self.attempts,
            "seconds": self.seconds,
            "attempts_per_second": self.throughput,
            "counts": dict(self.counts),
            "allowed": list(self.allowed),
            "disallowed": self.disallowed,
            "passed": self.passed,
            "first_divergence_steps": dict(self.first_divergence_steps),
            "examples": [c.to_dict() for c in self.examples()],
        }


def recorded_attempts(
    source: RuntimeSource,
    job_type: str,
    from_version: str,
    *,
    sample: int | None = None,
    since: float | None = None,
    states: Sequence[str] | None = None,
) -> list[tuple[int, int]]:
    """``(job id, attempt)`` of recorded attempts that ran ``from_version``, newest jobs first."""
    runtime = source.runtime
    found: list[tuple[int, int]] = []
    with runtime.storage.transaction(readonly=True) as tx:
        jobs = tx.job_list(JobFilter(states, job_type, "production", 1_000_000, from_version))
        for job in jobs:
            if since is not None and job.created_at < since:
                continue
            events = tx.trace_query(TraceQuery(job_id=job.id))
            ran = {
                e.attempt
                for e in events
                if e.name == "job.leased" and e.data.get("version") == from_version
            }
            found.extend((job.id, a) for a in attempts_with_events(events) if a in ran)
            if sample is not None and len(found) >= sample:
                break
    return found[:sample] if sample is not None else found


def _effects(events: list[TraceEvent]) -> Counter[tuple[str, str]]:
    return Counter(
        (str(e.data.get("kind")), str(e.data.get("key")))
        for e in events
        if e.name in _EFFECT_EVENTS
    )


def _cache_writes(events: list[TraceEvent]) -> dict[str, Any]:
    return {str(e.data.get("key")): e.data.get("shape") for e in events if e.name == "cache.write"}


def _duration(lifecycle: list[TraceEvent]) -> float | None:
    for event in lifecycle:
        if event.name in ("job.succeeded", "job.failed") and "duration" in event.data:
            return float(event.data["duration"])
    return None


def classify(
    report: ReplayReport, recorded: list[TraceEvent], now: list[TraceEvent]
) -> tuple[list[str], dict[str, Any]]:
    """The difference classes of one compared attempt, with what differed in each."""
    classes: dict[str, Any] = {}
    a, b = report.outcome_recorded, report.outcome_now
    if b.error_class == "replay":
        classes["unrecorded_call"] = b.error
    elif a.status != b.status or (a.status == "failed" and a.error_class != b.error_class):
        classes["outcome"] = {"recorded": a.to_dict(), "now": b.to_dict()}
    if report.retry_recorded and report.retry_now and report.retry_recorded != report.retry_now:
        classes["retry_decision"] = {"recorded": report.retry_recorded, "now": report.retry_now}
    if report.unrecorded_io:
        classes["unrecorded_io"] = report.unrecorded_io
    elif report.decisions or (
        report.first_divergence is not None and "unrecorded_call" not in classes
    ):
        classes["decision_path"] = {
            "decisions": report.decisions,
            "first_divergence": report.first_divergence.reason if report.first_divergence else None,
        }
    if _effects(recorded) != _effects(now):
        classes["effects"] = {
            "recorded": sorted(map(list, _effects(recorded).elements())),
            "now": sorted(map(list, _effects(now).elements())),
        }
    if report.state_writes:
        classes["state"] = report.state_writes
    cache_before, cache_now = _cache_writes(recorded), _cache_writes(now)
    if set(cache_before) != set(cache_now):
        classes["cache_keys"] = {"recorded": sorted(cache_before), "now": sorted(cache_now)}
    changed_shapes = {
        key: {"recorded": cache_before[key], "now": cache_now[key]}
        for key in set(cache_before) & set(cache_now)
        if cache_before[key] is not None
        and codec.dumps(cache_before[key]) != codec.dumps(cache_now[key])
    }
    if changed_shapes:
        classes["cache_shape"] = changed_shapes
    return [c for c in DIFFERENCE_CLASSES if c in classes], classes


def verify_rollout(
    source: RuntimeSource,
    job_type: str,
    *,
    from_version: str,
    to_version: str,
    sample: int | None = None,
    since: float | None = None,
    states: Sequence[str] | None = None,
    allow: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    max_per_second: float | None = None,
) -> VerifyReport:
    """Dry-run ``to_version`` over recorded attempts of ``from_version``; class the differences.

    ``allow``: classes that do not fail the report. ``progress(done, total)`` is
    called after each attempt; ``max_per_second`` throttles (a shared database).
    """
    runtime = source.runtime
    runtime.registry.handler(job_type, to_version)  # refuse an undeclared version up front
    todo = recorded_attempts(
        source, job_type, from_version, sample=sample, since=since, states=states
    )
    report = VerifyReport(job_type, from_version, to_version, tuple(allow))
    started = time.perf_counter()
    for done, (job_id, attempt) in enumerate(todo, 1):
        tick = time.perf_counter()
        replayed = dry_run(source, job_id, attempt=attempt, version=to_version)
        elapsed = time.perf_counter() - tick
        with runtime.storage.transaction(readonly=True) as tx:
            recorded_all = [
                e for e in tx.trace_query(TraceQuery(job_id=job_id)) if e.attempt == attempt
            ]
            now = tx.trace_query(TraceQuery(trace_id=replayed.trace_id))
        recorded = [e for e in recorded_all if e.kind == "domain"]
        classes, details = classify(replayed, recorded, now)
        step = replayed.first_divergence.step if replayed.first_divergence else None
        report.comparisons.append(
            AttemptComparison(
                job_id=job_id,
                attempt=attempt,
                classes=classes,
                details=details,
                first_divergence_step=step,
                duration_recorded=_duration([e for e in recorded_all if e.kind == "lifecycle"]),
                duration_now=elapsed,
                fork_command=(
                    f"replayq fork {job_id} --attempt {attempt} --version {to_version} "
                    f"--from-step {step or 'STEP'} --app MODULE:APP"
                ),
            )
        )
        report.counts.update(classes)
        if classes:
            report.first_divergence_steps[step or "(same steps)"] += 1
        report.attempts = done
        if progress is not None:
            progress(done, len(todo))
        if max_per_second:
            pause = 1 / max_per_second - (time.perf_counter() - tick)
            if pause > 0:
                time.sleep(pause)
    report.seconds = time.perf_counter() - started
    return report
