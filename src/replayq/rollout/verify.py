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

The replay engine is imported by the functions that replay, not by the module: every
worker imports this one (the ``replayq.verify`` handler, shadow runs) and most never
verify, while the engine was the largest part of a worker's start.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from replayq import codec
from replayq.model import Job, TraceEvent
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import JobFilter, TraceQuery

if TYPE_CHECKING:
    from replayq.replay.engine import ReplayReport

# Stands for the --app of an example's fork command until ``point_forks_at`` names the
# real one (``rollout verify``'s own; a background run's, if it was started with one).
APP_PLACEHOLDER = "MODULE:APP"

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

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> AttemptComparison:
        return cls(**{f.name: body[f.name] for f in fields(cls)})


@dataclass
class VerifyReport:
    """Every attempt compared, counted per difference class (``CLASSES``, in report order).

    A report over no attempt proves nothing: its ``verdict`` is ``empty`` and ``passed``
    is false, and ``empty_reason`` says why the selection found none when that is known
    (no job of the type, none recorded on ``from_version``, none in the window or state).
    """

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
    empty_reason: str | None = None

    @property
    def differing(self) -> list[AttemptComparison]:
        return [c for c in self.comparisons if c.classes]

    @property
    def disallowed(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if k not in self.allowed}

    @property
    def verdict(self) -> str:
        """``empty`` (no attempt compared: nothing proven), ``findings`` (differences
        outside ``allowed``) or ``passed``."""
        if not self.attempts:
            return "empty"
        return "findings" if self.disallowed else "passed"

    @property
    def passed(self) -> bool:
        """Attempts were compared and none differed outside ``allowed``."""
        return self.verdict == "passed"

    @property
    def throughput(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0

    def examples(self, limit: int = EXAMPLES) -> list[AttemptComparison]:
        return self.differing[:limit]

    @property
    def forks_need_app(self) -> bool:
        """Whether an example's fork command still says ``--app MODULE:APP``."""
        placeholder = f"--app {APP_PLACEHOLDER}"
        return any(placeholder in c.fork_command for c in self.examples())

    def point_forks_at(self, app_spec: str) -> None:
        """Put ``app_spec`` (``module:attribute``) in each fork command's ``--app``."""
        placeholder = f"--app {APP_PLACEHOLDER}"
        for comparison in self.comparisons:
            comparison.fork_command = comparison.fork_command.replace(
                placeholder, f"--app {app_spec}"
            )

    def add(self, comparison: AttemptComparison) -> None:
        """Count one more compared attempt."""
        self.comparisons.append(comparison)
        self.counts.update(comparison.classes)
        if comparison.classes:
            self.first_divergence_steps[comparison.first_divergence_step or "(same steps)"] += 1
        self.attempts += 1

    def merge(self, part: Mapping[str, Any]) -> None:
        """Add a part's summary (``summary()`` of a report over a slice of the attempts).

        Parts merged in order give the report of one run over all of them: the
        counts add up and the examples stay the first differing attempts.
        """
        self.attempts += int(part["attempts"])
        self.seconds += float(part["seconds"])
        self.counts.update(part["counts"])
        self.first_divergence_steps.update(part["first_divergence_steps"])
        kept = EXAMPLES - len(self.differing)
        self.comparisons.extend(AttemptComparison.from_dict(c) for c in part["examples"][:kept])

    def summary(self) -> dict[str, Any]:
        """Counts, histogram and the first differing examples: what ``merge`` adds up."""
        return {
            "attempts": self.attempts,
            "seconds": self.seconds,
            "counts": dict(self.counts),
            "first_divergence_steps": dict(self.first_divergence_steps),
            "examples": [c.to_dict() for c in self.examples()],
        }

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
            "verdict": self.verdict,
            "empty_reason": self.empty_reason,
            "first_divergence_steps": dict(self.first_divergence_steps),
            "examples": [c.to_dict() for c in self.examples()],
        }


RecordedAttempt = tuple[int, int, bool]
"""``(job id, attempt, whether it is the job's last recorded attempt)``."""


def recorded_attempts(
    source: RuntimeSource,
    job_type: str,
    from_version: str,
    *,
    sample: int | None = None,
    since: float | None = None,
    states: Sequence[str] | None = None,
) -> list[RecordedAttempt]:
    """Recorded attempts that ran ``from_version``, newest jobs first."""
    from replayq.replay.recorded import attempts_with_events

    runtime = source.runtime
    found: list[RecordedAttempt] = []
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
            recorded = attempts_with_events(events)
            found.extend((job.id, a, a == recorded[-1]) for a in recorded if a in ran)
            if sample is not None and len(found) >= sample:
                break
    return found[:sample] if sample is not None else found


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


# The most jobs ``why_nothing_selected`` reads of a type, and of its version.
_REASON_SCAN = 10_000


def why_nothing_selected(
    source: RuntimeSource,
    job_type: str,
    from_version: str,
    *,
    sample: int | None = None,
    since: float | None = None,
    states: Sequence[str] | None = None,
) -> str:
    """Why ``recorded_attempts`` with these arguments selected nothing: the first filter
    that left no job, in words (a misspelled version, an empty window, another state)."""
    if sample is not None and sample < 1:
        return f"a sample of {sample} selects no attempt"
    runtime = source.runtime
    # Bounded reads: the reason for an empty selection (often a misspelled version) must
    # not load a large history (it read every job row of the type, payloads included:
    # 730 MB at 200,000 jobs). The newest ``_REASON_SCAN`` jobs are enough to name it.
    with runtime.storage.transaction(readonly=True) as tx:
        of_type = tx.job_list(JobFilter(None, job_type, "production", _REASON_SCAN))
        matching = tx.job_list(
            JobFilter(None, job_type, "production", _REASON_SCAN, version=from_version)
        )
    if not of_type:
        return f"no job of type {job_type!r} is recorded in this database"
    if not matching:
        versions = sorted({j.handler_version for j in of_type if j.handler_version})
        among = f" among its newest {_REASON_SCAN:,}" if len(of_type) == _REASON_SCAN else ""
        return (
            f"no {job_type} job is recorded on version {from_version!r} "
            f"(recorded versions{among}: {', '.join(versions) or 'none'})"
        )
    if since is not None:
        recent = [j for j in matching if j.created_at >= since]
        if not recent:
            newest = max(j.created_at for j in matching)
            return (
                f"{_count(matching)} {job_type} job(s) of {from_version} are recorded, none "
                f"created since {_utc(since)} (the window; the newest: {_utc(newest)})"
            )
        matching = recent
    if states:
        found = Counter(j.state.value for j in matching)
        return (
            f"none of the {_count(matching)} {job_type} job(s) of {from_version} is now "
            f"{' or '.join(states)} (they are: "
            f"{', '.join(f'{state} {n}' for state, n in sorted(found.items()))})"
        )
    if not any(j.attempt for j in matching):
        return f"{_count(matching)} {job_type} job(s) of {from_version} match, none has run yet"
    return (
        f"{_count(matching)} {job_type} job(s) of {from_version} match, and no attempt that ran "
        f"{from_version} recorded a ctx step or call: nothing a replay can re-run"
    )


def _count(jobs: Sequence[Job]) -> str:
    """How many jobs a reason counts: past the bounded read, "10000+" (the newest read)."""
    return f"{_REASON_SCAN}+" if len(jobs) >= _REASON_SCAN else str(len(jobs))


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
    from replayq.replay.decision import decisions_differ  # the replay engine, loaded lazily

    classes: dict[str, Any] = {}
    a, b = report.outcome_recorded, report.outcome_now
    if b.error_class == "replay":
        classes["unrecorded_call"] = b.error
    elif a.status != b.status or (a.status == "failed" and a.error_class != b.error_class):
        classes["outcome"] = {"recorded": a.to_dict(), "now": b.to_dict()}
    if decisions_differ(report.retry_recorded, report.retry_now):
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


BATCH = 50
"""Attempts dry-run together (one ``dry_run_many`` call), and the throttle's unit."""


def _replay_batch(
    source: RuntimeSource, batch: Sequence[RecordedAttempt], to_version: str
) -> list[ReplayReport]:
    """Dry-run each attempt of ``batch`` under ``to_version``, writing nothing.

    Jobs' last attempts go through ``dry_run_many`` (the bulk path) together; an earlier
    attempt (a failure that was retried), or one that stopped being the last since it
    was selected, is dry-run on its own.
    """
    from replayq.replay.engine import dry_run, dry_run_many

    last = [job_id for job_id, _, is_last in batch if is_last]
    bulk = dry_run_many(source, last, version=to_version, keep=False) if last else []
    by_job = {report.job_id: report for report in bulk}
    reports = []
    for job_id, attempt, _ in batch:
        report = by_job.get(job_id)
        if report is None or report.attempt != attempt:
            report = dry_run(source, job_id, attempt=attempt, version=to_version, keep=False)
        reports.append(report)
    return reports


def _reproduce_command(
    job_id: int, attempt: int, to_version: str, step: str | None, recorded: list[TraceEvent]
) -> str:
    """The command that reproduces one compared attempt, runnable as printed.

    ``fork --from-step`` takes only a step the attempt recorded (its ``step.started``,
    also a step that made no ``ctx`` call): the first divergence's step if the recording
    has it, else the attempt's first step, the whole run (same steps with other values,
    or a step only the candidate has). An attempt with no step at all cannot be forked:
    its whole sealed run is ``replay --mode dry-run``.
    """
    steps = [str(e.data["step_name"]) for e in recorded if e.name == "step.started"]
    target = f"--attempt {attempt} --version {to_version}"
    if not steps:
        return f"replayq replay {job_id} --mode dry-run {target} --app {APP_PLACEHOLDER}"
    fork_from = step if step in steps else steps[0]
    return (
        f"replayq fork {job_id} {target} --from-step {shlex.quote(fork_from)} "
        f"--app {APP_PLACEHOLDER}"
    )


def compare_attempts(
    source: RuntimeSource,
    todo: Sequence[RecordedAttempt],
    to_version: str,
    *,
    max_per_second: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[AttemptComparison]:
    """Each attempt of ``todo`` run under ``to_version`` in the sealed world, compared.

    Runs in batches of ``BATCH``; ``progress(n)`` after each batch with the number
    just done; ``max_per_second`` throttles between batches. An attempt's
    ``duration_now`` is its batch's mean (the runs of a batch are timed together).
    """
    runtime = source.runtime
    for start in range(0, len(todo), BATCH):
        batch = todo[start : start + BATCH]
        tick = time.perf_counter()
        reports = _replay_batch(source, batch, to_version)
        elapsed = (time.perf_counter() - tick) / len(batch)
        with runtime.storage.transaction(readonly=True) as tx:
            recorded_by_job = {
                job_id: tx.trace_query(TraceQuery(job_id=job_id)) for job_id, _, _ in batch
            }
        for (job_id, attempt, _), replayed in zip(batch, reports, strict=True):
            recorded_all = [e for e in recorded_by_job[job_id] if e.attempt == attempt]
            recorded = [e for e in recorded_all if e.kind == "domain"]
            # A run the quick check found the same as recorded built no events: the
            # recording's stand for them (equal on every field ``classify`` reads).
            now = recorded if replayed.matched_in_memory else replayed.events_now
            classes, details = classify(replayed, recorded, now)
            step = replayed.first_divergence.step if replayed.first_divergence else None
            yield AttemptComparison(
                job_id=job_id,
                attempt=attempt,
                classes=classes,
                details=details,
                first_divergence_step=step,
                duration_recorded=_duration([e for e in recorded_all if e.kind == "lifecycle"]),
                duration_now=elapsed,
                fork_command=_reproduce_command(job_id, attempt, to_version, step, recorded_all),
            )
        if progress is not None:
            progress(len(batch))
        if max_per_second:
            pause = len(batch) / max_per_second - (time.perf_counter() - tick)
            if pause > 0:
                time.sleep(pause)


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
    called after each batch of attempts; ``max_per_second`` throttles (a shared
    database). Nothing is written: run it in the background, resumable, with
    ``replayq.start_verify`` (``rollout verify --background``).
    """
    runtime = source.runtime
    runtime.registry.handler(job_type, to_version)  # refuse an undeclared version up front
    todo = recorded_attempts(
        source, job_type, from_version, sample=sample, since=since, states=states
    )
    report = VerifyReport(job_type, from_version, to_version, tuple(allow))
    started = time.perf_counter()

    def advance(n: int) -> None:
        if progress is not None:
            progress(report.attempts, len(todo))

    for comparison in compare_attempts(
        source, todo, to_version, max_per_second=max_per_second, progress=advance
    ):
        report.add(comparison)
    report.seconds = time.perf_counter() - started
    if not todo:
        report.empty_reason = why_nothing_selected(
            source, job_type, from_version, sample=sample, since=since, states=states
        )
    return report
