"""Comparing two traces (an original and a fork, or any two jobs), key by key.

For each side: the state each entity ended with and the fields that changed,
the decisions taken, the effects intended (run for real in production,
substituted in a fork), cache writes, and the outcome.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from replayq.model import TraceEvent
from replayq.runtime import RuntimeSource

EFFECT_EVENTS = ("effect.succeeded", "effect.replayed", "effect.failed")


@dataclass
class TraceSummary:
    """What one trace did, in comparable form."""

    trace_id: str
    label: str
    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[str, list[Any]] = field(default_factory=dict)
    effects: Counter[str] = field(default_factory=Counter)
    cache_writes: list[str] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)
    outcome: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        body = dict(vars(self))
        body["effects"] = dict(self.effects)
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
    for event in events:
        name, data = event.name, event.data
        if name == "state.write" and event.resource:
            _apply(summary.writes.setdefault(event.resource, {}), data.get("delta"))
            if event.resource_version is not None:
                summary.versions.setdefault(event.resource, []).append(event.resource_version)
        elif name == "decision":
            summary.decisions.setdefault(str(data.get("decision")), []).append(data.get("value"))
        elif name in EFFECT_EVENTS:
            summary.effects[f"{data.get('kind')} [{data.get('key')}]"] += 1
        elif name == "cache.write":
            summary.cache_writes.append(str(data.get("key")))
        elif name in ("job.succeeded", "replay.finished", "fork.finished", "rerun.finished"):
            summary.outcome = event.status or "succeeded"
        elif name in ("job.dead", "job.failed") and summary.outcome != "succeeded":
            summary.outcome = f"{event.status} ({data.get('error_class') or data.get('reason')})"
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


def resolve(source: RuntimeSource, ref: str) -> tuple[str, str, list[TraceEvent]]:
    """A job id or trace id → (trace id, label, events)."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        if ref.isdigit():
            job = tx.job_get(int(ref))
            if job is None:
                from replayq.errors import ReplayqError

                raise ReplayqError(f"no job with id {ref}")
            return job.trace_id, f"job {job.id} ({job.handler_version})", tx.trace_for_job(job.id)
        lineage = tx.lineage_get(ref)
        events = tx.trace_for_trace(ref)
    label = f"{lineage['origin']} of job {lineage['source_job_id']}" if lineage else ref
    return ref, label, events


def diff_traces(source: RuntimeSource, a: str, b: str) -> TraceDiff:
    """Compare two traces (job ids or trace ids) key by key."""
    runtime = source.runtime
    left = summarise(*resolve(runtime, a))
    right = summarise(*resolve(runtime, b))
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
        if left.effects[kind] != right.effects[kind]:
            effects.append({"effect": kind, "a": left.effects[kind], "b": right.effects[kind]})
    return TraceDiff(
        left, right, state, decisions, effects, {"a": left.outcome, "b": right.outcome}
    )


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
    lines.append("effects intended:")
    kinds = sorted(set(diff.a.effects) | set(diff.b.effects))
    if not kinds:
        lines.append("  (none)")
    for kind in kinds:
        mark = "" if diff.a.effects[kind] == diff.b.effects[kind] else "   <-- differs"
        lines.append(f"  {kind}:  a={diff.a.effects[kind]}  b={diff.b.effects[kind]}{mark}")
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
