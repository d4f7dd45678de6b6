"""Comparing two traces (an original and a fork, or any two jobs), key by key, like with like.

A side is ``JOB[@ATTEMPT]`` or a derived trace id (replay, fork, rerun). A job
compared with one of its own forks is read at the attempt the fork was made
from; otherwise a job without ``@ATTEMPT`` is read at its last attempt that
recorded anything. An unknown job or trace id is an error, never an empty side.

For each side: the state each entity ended with and the fields that changed
(only writes that committed: a write fencing rejected, or whose step failed,
is listed as not committed), the decisions taken, the effects counted as
executions that succeeded, failed, were deduplicated or fenced, cache writes,
and the outcome with its failure message.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import ReplayqError
from replayq.model import TraceEvent
from replayq.runtime import RuntimeSource
from replayq.storage.context_params import LineageQuery
from replayq.storage.protocol import TraceQuery

# How each effect event counts: an execution that succeeded (a replayed one stands for the
# recorded success), failed, was deduplicated by its idempotency record, or was fenced.
EFFECT_COUNTS = {
    "effect.succeeded": "succeeded",
    "effect.replayed": "succeeded",
    "effect.failed": "failed",
    "effect.deduplicated": "deduplicated",
    "effect.in_doubt": "in_doubt",
    "effect.refused": "refused",
    "write.fenced": "fenced",
}
REJECTED = "REJECTED by fencing (stale fencing token)"
ABANDONED = "not committed (its step still ran when the attempt ended)"
OUTCOME_EVENTS = ("job.succeeded", "replay.finished", "fork.finished", "rerun.finished")


def _effect_count(event: TraceEvent) -> str:
    """How an effect event counts; a fenced one by what was refused: the claim (the effect
    never ran) or the outcome of an effect that ran (it happened; its record stays in doubt)."""
    if event.name != "write.fenced":
        return EFFECT_COUNTS[event.name]
    refused = " ".join(str(r) for r in event.data.get("refused") or [])
    if "effect result" in refused:
        return "succeeded (outcome fenced)"
    if "effect failure" in refused:
        return "failed (outcome fenced)"
    return "fenced"


def write_key(event: TraceEvent) -> tuple[str, int | None, int | None]:
    return (event.trace_id, event.attempt, event.seq)


def uncommitted_writes(events: list[TraceEvent]) -> dict[tuple[str, int | None, int | None], str]:
    """The ``state.write`` events that never committed, with why: fencing rejected the write,
    its step failed (the step's writes are discarded together), or its step still ran when
    its attempt ended (``step.abandoned``: its writes are dropped). A step's end commits
    or drops the writes of the steps it is nested in as well, made since their thread's
    last commit (``StepFlow``: a thread's steps hold their writes together). A write that
    names no step (made outside any step of its thread: a thread or task a step started,
    say) waits for the attempt's next commit, the next step's end in any thread: a failed
    one drops it with the step's own."""
    found: dict[tuple[str, int | None, int | None], str] = {}
    open_writes: dict[tuple[str, int | None, str | None], list[TraceEvent]] = {}
    # The step each step is nested in (its ``step.started`` names it), by attempt and name.
    nested_in: dict[tuple[str, int | None, str | None], str | None] = {}
    # The writes outside steps, by attempt, waiting for its next step's end.
    waiting: dict[tuple[str, int | None], list[TraceEvent]] = {}
    # A rejection is recorded at the step's commit, after the step closed: it belongs to the
    # next step.finished of the same attempt.
    rejected: dict[tuple[str, int | None], set[str]] = {}
    for event in events:
        step = event.step if event.name == "state.write" else event.data.get("step_name")
        scope = (event.trace_id, event.attempt, step)
        if event.name == "state.write":
            if event.step is not None:
                open_writes.setdefault(scope, []).append(event)
            else:
                waiting.setdefault((event.trace_id, event.attempt), []).append(event)
        elif event.name == "step.started":
            nested_in[scope] = event.step
        elif event.name == "state.write_rejected" and event.resource:
            rejected.setdefault((event.trace_id, event.attempt), set()).add(event.resource)
        elif event.name == "step.abandoned":
            for name in event.data.get("open_steps") or ():
                for write in open_writes.pop((event.trace_id, event.attempt, name), []):
                    found[write_key(write)] = ABANDONED
        elif event.name == "step.finished":
            writes = open_writes.pop(scope, [])
            outer, seen = nested_in.get(scope), {step, None}
            while outer not in seen:  # a name nested in itself (``a`` in ``a``) ends it
                seen.add(outer)
                enclosing = (event.trace_id, event.attempt, outer)
                writes += open_writes.pop(enclosing, [])
                outer = nested_in.get(enclosing)
            writes += waiting.pop((event.trace_id, event.attempt), [])
            fenced = rejected.pop((event.trace_id, event.attempt), set())
            if event.status == "success":
                continue
            for write in writes:
                found[write_key(write)] = (
                    REJECTED if write.resource in fenced else "not committed (its step failed)"
                )
    return found


@dataclass
class TraceSummary:
    """What one trace did, in comparable form."""

    trace_id: str
    label: str
    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[str, list[Any]] = field(default_factory=dict)
    effects: dict[str, Counter[str]] = field(default_factory=dict)
    cache_writes: list[str] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)
    not_committed: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        body = dict(vars(self))
        body["effects"] = {k: dict(v) for k, v in self.effects.items()}
        return body


def _apply(fields: dict[str, Any], delta: Any) -> None:
    if not isinstance(delta, dict):
        return
    if "replace" in delta:
        fields.clear()
        value = delta["replace"]
        fields.update(value if isinstance(value, dict) else {"(value)": value})
        return
    fields.update(delta.get("set", {}))
    for name in delta.get("unset", []):
        fields[name] = None


def summarise(trace_id: str, label: str, events: list[TraceEvent]) -> TraceSummary:
    summary = TraceSummary(trace_id, label)
    dropped = uncommitted_writes(events)
    failure = ""
    for event in events:
        name, data = event.name, event.data
        if name == "state.write" and event.resource:
            why = dropped.get(write_key(event))
            if why is not None:
                summary.not_committed.append(
                    {"resource": event.resource, "version": event.resource_version, "why": why}
                )
                continue
            _apply(summary.writes.setdefault(event.resource, {}), data.get("delta"))
            if event.resource_version is not None:
                summary.versions.setdefault(event.resource, []).append(event.resource_version)
        elif name == "decision":
            summary.decisions.setdefault(str(data.get("decision")), []).append(data.get("value"))
        elif name in EFFECT_COUNTS and (name != "write.fenced" or data.get("kind")):
            label_ = f"{data.get('kind')} [{data.get('key')}]"
            summary.effects.setdefault(label_, Counter())[_effect_count(event)] += 1
        elif name == "cache.write":
            summary.cache_writes.append(str(data.get("key")))
        elif name in OUTCOME_EVENTS:
            summary.outcome = event.status or "succeeded"
            if event.status == "failed":
                summary.outcome = f"failed [{data.get('error_class')}]: {data.get('error')}"
        elif name == "job.failed":
            failure = f"[{data.get('error_class')}]: {data.get('error')}"
            summary.outcome = f"failed {failure}"
        elif name == "retry.scheduled" and summary.outcome.startswith("failed"):
            summary.outcome += " (retry scheduled)"
        elif name == "job.dead":
            summary.outcome = f"dead ({data.get('reason')})" + (f" {failure}" if failure else "")
        elif name == "job.write_rejected":
            summary.outcome = "incomplete: its final write was rejected (lease lost)"
        elif name == "lease.released" and data.get("storage_fault"):
            summary.outcome = (
                f"incomplete: put back, the queue's database was unavailable "
                f"({data['storage_fault']})"
            )
    if summary.outcome == "unknown" and any(e.kind == "domain" for e in events):
        summary.outcome = "incomplete: the attempt never settled (worker died or stalled)"
    return summary


@dataclass
class TraceDiff:
    """Side by side: ``a`` (usually the original) and ``b`` (usually the fork)."""

    a: TraceSummary
    b: TraceSummary
    state: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    effects: list[dict[str, Any]]
    outcome: dict[str, str]

    @property
    def identical(self) -> bool:
        return not (self.state or self.decisions or self.effects) and (
            self.outcome["a"] == self.outcome["b"]
        )

    @property
    def diverged(self) -> bool:
        """``b`` did something ``a`` did not: a state field, a decision, an effect count, or
        it ended otherwise (succeeded, failed, incomplete). Unlike ``identical``, a dead
        job's last attempt and a replay that failed the same way end alike."""
        endings = {ending(self.outcome["a"]), ending(self.outcome["b"])}
        return bool(self.state or self.decisions or self.effects) or len(endings) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "state": self.state,
            "decisions": self.decisions,
            "effects": self.effects,
            "outcome": self.outcome,
            "identical": self.identical,
        }


ALL_ATTEMPTS = 0


def ending(outcome: str) -> str:
    """How a run ended, without its detail: ``succeeded``, ``failed`` (a dead job's last
    attempt too), ``incomplete`` or ``unknown`` (not finished yet)."""
    word = outcome.split(" ", 1)[0].rstrip(":")
    return "failed" if word in ("failed", "dead") else word


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``JOB``, ``JOB@ATTEMPT``, ``JOB@all`` (every attempt together), ``TRACE`` → (id, attempt)."""
    base, sep, attempt = ref.rpartition("@")
    if sep and base and attempt == "all":
        return base, ALL_ATTEMPTS
    if sep and base and attempt.isdigit():
        return base, int(attempt)
    return ref, None


def resolve(
    source: RuntimeSource, ref: str, *, default_attempt: int | None = None
) -> tuple[str, str, list[TraceEvent]]:
    """A job id (optionally ``@ATTEMPT``) or a trace id → (trace id, label, events)."""
    runtime = source.runtime
    ident, attempt = parse_ref(ref)
    with runtime.storage.transaction(readonly=True) as tx:
        if ident.isdigit():
            job = tx.job_get(int(ident))
            if job is None:
                raise ReplayqError(f"no job with id {ident}")
            events = tx.trace_query(TraceQuery(job_id=job.id))
            recorded = sorted({e.attempt for e in events if e.kind == "domain" and e.attempt})
            chosen = attempt if attempt is not None else default_attempt
            if chosen is None and recorded:
                chosen = recorded[-1]
            if chosen == ALL_ATTEMPTS:
                return job.trace_id, f"job {job.id} ({job.handler_version}) all attempts", events
            if chosen is not None:
                if chosen not in {e.attempt for e in events}:
                    raise ReplayqError(
                        f"job {job.id} has no attempt {chosen}; attempts recorded: {recorded}"
                    )
                events = [e for e in events if e.attempt == chosen]
            label = f"job {job.id} ({job.handler_version})"
            if chosen is not None:
                label += f" attempt {chosen}"
            return job.trace_id, label, events
        lineage = next(iter(tx.lineage_list(LineageQuery(trace_id=ident))), None)
        events = tx.trace_query(TraceQuery(trace_id=ident))
    if lineage is None and not events:
        raise ReplayqError(
            f"{ident!r} is neither a job id nor a known trace id (replay, fork or rerun)"
        )
    label = f"{lineage.origin} of job {lineage.source_job_id}" if lineage else ident
    return ident, label, events


def _fork_attempt(source: RuntimeSource, ref: str, other: str) -> int | None:
    """The attempt ``other`` (a derived trace) was made from, when ``ref`` is its source job."""
    ident, attempt = parse_ref(ref)
    other_ident, _ = parse_ref(other)
    if attempt is not None or not ident.isdigit() or other_ident.isdigit():
        return None
    with source.runtime.storage.transaction(readonly=True) as tx:
        lineage = next(iter(tx.lineage_list(LineageQuery(trace_id=other_ident))), None)
    if lineage is None or str(lineage.source_job_id) != ident:
        return None
    details = codec.loads(lineage.details) or {}
    made_from = details.get("attempt")
    return int(made_from) if made_from is not None else None


def diff_traces(source: RuntimeSource, a: str, b: str) -> TraceDiff:
    """Compare two traces (``JOB[@ATTEMPT]`` or trace ids) key by key, like with like."""
    runtime = source.runtime
    left = summarise(*resolve(runtime, a, default_attempt=_fork_attempt(runtime, a, b)))
    right = summarise(*resolve(runtime, b, default_attempt=_fork_attempt(runtime, b, a)))
    state = []
    for resource in sorted(set(left.writes) | set(right.writes)):
        fields_a, fields_b = left.writes.get(resource, {}), right.writes.get(resource, {})
        for name in sorted(set(fields_a) | set(fields_b)):
            va, vb = fields_a.get(name, "(unchanged)"), fields_b.get(name, "(unchanged)")
            if va != vb:
                state.append({"resource": resource, "field": name, "a": va, "b": vb})
    decisions = []
    for name in sorted(set(left.decisions) | set(right.decisions)):
        if left.decisions.get(name) != right.decisions.get(name):
            decisions.append(
                {"decision": name, "a": left.decisions.get(name), "b": right.decisions.get(name)}
            )
    effects = []
    for kind in sorted(set(left.effects) | set(right.effects)):
        counts_a = dict(left.effects.get(kind, Counter()))
        counts_b = dict(right.effects.get(kind, Counter()))
        if counts_a != counts_b:
            effects.append({"effect": kind, "a": counts_a, "b": counts_b})
    return TraceDiff(
        left, right, state, decisions, effects, {"a": left.outcome, "b": right.outcome}
    )


def _counts(counts: Counter[str] | None) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{what} {n}" for what, n in sorted(counts.items()))


def render(diff: TraceDiff) -> str:
    """The diff for a terminal."""
    lines = [f"a: {diff.a.label}  [{diff.a.trace_id}]", f"b: {diff.b.label}  [{diff.b.trace_id}]"]
    lines.append("")
    lines.append("state (fields written):")
    if not diff.state:
        lines.append("  (same)")
    for row in diff.state:
        lines.append(f"  {row['resource']}.{row['field']}:  a={row['a']!r}  b={row['b']!r}")
    lines.append("decisions:")
    if not diff.decisions:
        lines.append("  (same)")
    for row in diff.decisions:
        lines.append(f"  {row['decision']}:  a={row['a']!r}  b={row['b']!r}")
    lines.append("effect executions:")
    kinds = sorted(set(diff.a.effects) | set(diff.b.effects))
    if not kinds:
        lines.append("  (none)")
    for kind in kinds:
        a, b = diff.a.effects.get(kind), diff.b.effects.get(kind)
        mark = "" if (a or Counter()) == (b or Counter()) else "   <-- differs"
        lines.append(f"  {kind}:  a={_counts(a)}  b={_counts(b)}{mark}")
    if diff.a.not_committed or diff.b.not_committed:
        lines.append("writes not committed:")
        for side, summary in (("a", diff.a), ("b", diff.b)):
            for row in summary.not_committed:
                lines.append(f"  {side}: {row['resource']}@v{row['version']}  {row['why']}")
    # Versions written beside cache keys written: a cache key's version should be the
    # entity version it was derived from.
    if diff.a.versions or diff.b.versions:
        lines.append("state versions written:")
        for side, summary in (("a", diff.a), ("b", diff.b)):
            written = [f"{r}@v{v}" for r, vs in sorted(summary.versions.items()) for v in vs]
            lines.append(f"  {side}: {', '.join(written) or '(none)'}")
    if diff.a.cache_writes or diff.b.cache_writes:
        lines.append("cache keys written:")
        for side, summary in (("a", diff.a), ("b", diff.b)):
            lines.append(f"  {side}: {', '.join(summary.cache_writes) or '(none)'}")
    lines.append(f"outcome:  a={diff.outcome['a']}  b={diff.outcome['b']}")
    return "\n".join(lines)
