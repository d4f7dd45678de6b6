"""How a re-execution compares with its recording: signatures, the first divergence, the report.

Each event that replay compares has a *signature* (what must match between the
recorded and the re-executed event; ``None``: not compared). ``Comparison`` takes
the re-execution's events as they are produced and notes the first mismatch at
once, so a dry-run compares in memory while it runs; ``first_divergence``,
``compare_decisions`` and ``compare_writes`` compare two finished sequences.
``ReplayReport`` is what a dry-run or fork returns; ``to_dict``/``from_dict`` carry it
as JSON (the bulk dry-run's worker processes send their reports that way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.model import TraceEvent
from replayq.replay.decision import decisions_differ
from replayq.replay.recorded import Outcome


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
    # The re-execution's own events (a dry-run's kept events, a fork's derived trace):
    # what a comparison reads when ``keep=False`` wrote nothing. Not part of ``to_dict``.
    events_now: list[TraceEvent] = field(default_factory=list, repr=False, compare=False)
    # True: a bulk verification's quick check found the run the same as its recording
    # without building its events (``replay.quick``); ``events_now`` is then empty, and
    # the recording's events stand for them. Not part of ``to_dict``.
    matched_in_memory: bool = field(default=False, repr=False, compare=False)

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
        if decisions_differ(self.retry_recorded, self.retry_now):
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
        skip = ("outcome_recorded", "outcome_now", "events_now", "matched_in_memory")
        body = {k: v for k, v in vars(self).items() if k not in skip}
        body["outcome_recorded"] = self.outcome_recorded.to_dict()
        body["outcome_now"] = self.outcome_now.to_dict()
        body["first_divergence"] = vars(self.first_divergence) if self.first_divergence else None
        body["outcome_divergence"] = self.outcome_divergence
        body["diverged"] = self.diverged
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> ReplayReport:
        """The report ``to_dict`` described (its derived fields are computed again)."""
        fields = {k: v for k, v in body.items() if k not in _DERIVED}
        fields["outcome_recorded"] = Outcome(**body["outcome_recorded"])
        fields["outcome_now"] = Outcome(**body["outcome_now"])
        found = body.get("first_divergence")
        fields["first_divergence"] = Divergence(**found) if found else None
        return cls(**fields)


_DERIVED = ("outcome_recorded", "outcome_now", "first_divergence", "outcome_divergence", "diverged")


def _canonical(value: Any) -> str:
    """``codec.dumps(value)``, the canonical text, without a validation walk: recorded values
    were checked once when recorded; a scalar is written as ``json`` writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    return codec.dumps_own(value)


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
        return ("decision", data.get("decision"), _canonical(data.get("value")))
    if name == "call":
        return ("call", data.get("call"), data.get("fingerprint"))
    if name in ("effect.succeeded", "effect.deduplicated", "effect.replayed", "effect.failed"):
        return ("effect", data.get("kind"), data.get("key"))
    if name == "state.read":
        return ("state.read", event.resource, event.resource_version)
    if name == "state.write":
        return ("state.write", event.resource, _canonical(data.get("delta")))
    if name in ("clock.now", "random.random", "random.uuid"):
        return (name,)
    if name == "cache.read":
        return ("cache.read", data.get("key"), data.get("hit"))
    if name in ("cache.write", "cache.invalidate"):
        return (name, data.get("key"))
    if name == "outbox.written":
        return ("outbox", data.get("topic"), _canonical(data.get("payload")))
    if name == "child.enqueued":
        return ("child", data.get("child_type"), _canonical(data.get("payload")))
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


def step_of(event: TraceEvent) -> str | None:
    """The step an event belongs to; a step boundary (recorded outside it) names its own step."""
    if event.step is None and event.name in ("step.started", "step.finished", "step.skipped"):
        name = event.data.get("step_name")
        return str(name) if name is not None else None
    return event.step


_Signed = tuple[TraceEvent, tuple[Any, ...]]


def _divergence(index: int, a: _Signed | None, b: _Signed | None) -> Divergence:
    if a is None:
        reason = "the re-execution did more than the recording"
    elif b is None:
        reason = "the re-execution stopped before the recording did"
    else:
        reason = f"recorded {a[1][0]} {a[1][1:]!r}, now {b[1][0]} {b[1][1:]!r}"
    return Divergence(
        index=index,
        step=(step_of(a[0]) if a else None) or (step_of(b[0]) if b else None),
        recorded_seq=a[0].seq if a else None,
        now_seq=b[0].seq if b else None,
        recorded=_describe(a[0]) if a else None,
        now=_describe(b[0]) if b else None,
        reason=reason,
    )


class Comparison:
    """The re-execution's events, compared with the recording's as they arrive.

    ``add`` takes events in the order they were made and notes the first whose
    signature differs from the recorded one at the same position; ``first`` is that
    divergence, or, once the run is over, where the re-execution stopped short.
    ``outcomes`` is ``compare_outcomes`` of the recording and every event added, from
    the decisions and writes grouped as they passed here (not two more passes).
    """

    def __init__(self, recorded: Iterable[TraceEvent]) -> None:
        signed: list[_Signed] = []
        append = signed.append
        decisions: dict[Any, list[Any]] = {}
        writes: dict[Any, list[Any]] = {}
        for event in recorded:
            name = event.name
            if name == "step.started":
                append((event, ("step", event.data.get("step_name"))))
                continue
            if name == "step.finished":
                append((event, ("step.end", event.data.get("step_name"), event.status)))
                continue
            if name == "decision":
                data = event.data
                decisions.setdefault(data.get("decision"), []).append(data.get("value"))
            elif name == "state.write":
                writes.setdefault(event.resource, []).append(event.data.get("delta"))
            mark = signature(event)
            if mark is not None:
                append((event, mark))
        self._left = signed
        self._recorded = (decisions, writes)
        self._decisions: dict[Any, list[Any]] = {}
        self._writes: dict[Any, list[Any]] = {}
        self._count = 0
        self._found: Divergence | None = None

    def add(self, events: Iterable[TraceEvent]) -> None:
        left = self._left
        index = self._count
        found = self._found
        for event in events:
            name = event.name
            if name == "step.started":
                mark: tuple[Any, ...] = ("step", event.data.get("step_name"))
            elif name == "step.finished":
                mark = ("step.end", event.data.get("step_name"), event.status)
            else:
                if name == "decision":
                    data = event.data
                    self._decisions.setdefault(data.get("decision"), []).append(data.get("value"))
                elif name == "state.write":
                    self._writes.setdefault(event.resource, []).append(event.data.get("delta"))
                signed = signature(event)
                if signed is None:
                    continue
                mark = signed
            if found is None:
                recorded = left[index] if index < len(left) else None
                if recorded is None or recorded[1] != mark:
                    found = self._found = _divergence(index, recorded, (event, mark))
            index += 1
        self._count = index

    def first(self) -> Divergence | None:
        """The first divergence, counting a recording the re-execution did not finish."""
        if self._found is None and self._count < len(self._left):
            return _divergence(self._count, self._left[self._count], None)
        return self._found

    def outcomes(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``compare_outcomes`` of the recording and the events added."""
        decisions, writes = self._recorded
        return (
            _listed(decisions, self._decisions, "decision"),
            _listed(writes, self._writes, "resource"),
        )


def first_divergence(recorded: list[TraceEvent], now: list[TraceEvent]) -> Divergence | None:
    """Compare two event sequences on their signatures; the first mismatch, if any."""
    comparison = Comparison(recorded)
    comparison.add(now)
    return comparison.first()


def _differing(
    recorded: list[TraceEvent],
    now: list[TraceEvent],
    name: str,
    key: Callable[[TraceEvent], Any],
    value: str,
    label: str,
) -> list[dict[str, Any]]:
    """Per ``key``, the ``value`` of each ``name`` event in order, where the two sides differ."""

    def grouped(events: list[TraceEvent]) -> dict[Any, list[Any]]:
        found: dict[Any, list[Any]] = {}
        for event in events:
            if event.name == name:
                found.setdefault(key(event), []).append(event.data.get(value))
        return found

    a, b = grouped(recorded), grouped(now)
    return [
        {label: k, "recorded": a.get(k, []), "now": b.get(k, [])}
        for k in sorted(set(a) | set(b), key=str)
        if a.get(k, []) != b.get(k, [])
    ]


def compare_decisions(recorded: list[TraceEvent], now: list[TraceEvent]) -> list[dict[str, Any]]:
    """Decisions whose values differ (by name, in order)."""
    return _differing(
        recorded, now, "decision", lambda e: e.data.get("decision"), "value", "decision"
    )


def compare_writes(recorded: list[TraceEvent], now: list[TraceEvent]) -> list[dict[str, Any]]:
    """State writes whose deltas differ (by resource)."""
    return _differing(recorded, now, "state.write", lambda e: e.resource, "delta", "resource")


def compare_outcomes(
    recorded: list[TraceEvent], now: list[TraceEvent]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``compare_decisions`` and ``compare_writes`` of the same two sequences, each read
    once (a dry-run's report asks both: four passes over ~35 events each were two)."""

    def grouped(events: list[TraceEvent]) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
        decisions: dict[Any, list[Any]] = {}
        writes: dict[Any, list[Any]] = {}
        for event in events:
            name = event.name
            if name == "decision":
                data = event.data
                decisions.setdefault(data.get("decision"), []).append(data.get("value"))
            elif name == "state.write":
                writes.setdefault(event.resource, []).append(event.data.get("delta"))
        return decisions, writes

    (a_decisions, a_writes), (b_decisions, b_writes) = grouped(recorded), grouped(now)
    return (
        _listed(a_decisions, b_decisions, "decision"),
        _listed(a_writes, b_writes, "resource"),
    )


def _listed(a: dict[Any, list[Any]], b: dict[Any, list[Any]], label: str) -> list[dict[str, Any]]:
    """``_differing``'s answer from the two sides grouped by key."""
    if a == b:
        return []
    return [
        {label: k, "recorded": a.get(k, []), "now": b.get(k, [])}
        for k in sorted(set(a) | set(b), key=str)
        if a.get(k, []) != b.get(k, [])
    ]


def from_step(events: list[TraceEvent], step: str) -> list[TraceEvent]:
    """The events from the start of step ``step`` on (none if it never started)."""
    for index, event in enumerate(events):
        if event.name == "step.started" and event.data.get("step_name") == step:
            return events[index:]
    return []
