"""A recorded attempt, read back from the trace, and the answers it gives a replay.

``Recording`` holds one attempt's domain events (large values resolved from the
blob store) and its outcome. ``RecordedWorld`` is the ``World`` a
replaying context consults: calls, effects, clock and random reads and cache
reads come from the recording, in order; a call or effect that failed in the
recording raises ``RecordedFailure`` again; anything the recording lacks raises
``ReplayDivergenceError`` (deny by default) or, after a fork point, returns an
explicit stub.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from replayq.errors import RecordedFailure, ReplayDivergenceError, ReplayqError
from replayq.model import Job, TraceEvent
from replayq.queue.enqueue import get_job
from replayq.recording.blobs import load_json
from replayq.runtime import RuntimeSource

EFFECT_OUTCOMES = ("effect.succeeded", "effect.deduplicated", "effect.replayed")


@dataclass(frozen=True)
class Outcome:
    """How an execution ended: ``succeeded`` (with result), ``failed`` (class, error), or
    ``incomplete`` (the process died or the lease was lost before it settled)."""

    status: str
    result: Any = None
    error_class: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class Recording:
    """One recorded attempt of a job."""

    job: Job
    attempt: int
    events: list[TraceEvent]
    lifecycle: list[TraceEvent]
    outcome: Outcome
    start_hlc: int
    values: dict[int, Any] = field(default_factory=dict)

    def value(self, event: TraceEvent, key: str) -> Any:
        """A recorded value of an event, read from the blob store when it was large."""
        if event.output_ref is not None and event.id in self.values:
            return self.values[event.id]
        return event.data.get(key)


def attempts_with_events(events: list[TraceEvent]) -> list[int]:
    return sorted({e.attempt for e in events if e.kind == "domain" and e.attempt})


def load_recording(source: RuntimeSource, job_id: int, attempt: int | None = None) -> Recording:
    """Read a job's attempt (default: the last one that recorded domain events)."""
    runtime = source.runtime
    job = get_job(runtime, job_id)
    with runtime.storage.transaction(readonly=True) as tx:
        events = tx.trace_for_job(job_id)
        values = {
            e.id: load_json(tx, None, e.output_ref)
            for e in events
            if e.output_ref is not None and e.id is not None
        }
    candidates = attempts_with_events(events)
    if attempt is None:
        if not candidates:
            raise ReplayqError(f"job {job_id} has no recorded execution to replay")
        attempt = candidates[-1]
    if attempt not in candidates:
        raise ReplayqError(
            f"job {job_id} attempt {attempt} recorded nothing; attempts with a recording: "
            f"{candidates or 'none'}"
        )
    domain = sorted(
        (e for e in events if e.kind == "domain" and e.attempt == attempt),
        key=lambda e: (e.seq or 0, e.hlc),
    )
    lifecycle = [e for e in events if e.kind == "lifecycle" and e.attempt == attempt]
    leased = [e.hlc for e in lifecycle if e.name == "job.leased"]
    start_hlc = leased[0] if leased else (domain[0].hlc - 1)
    return Recording(job, attempt, domain, lifecycle, outcome_of(job, lifecycle), start_hlc, values)


def outcome_of(job: Job, lifecycle: list[TraceEvent]) -> Outcome:
    for event in reversed(lifecycle):
        if event.name == "job.succeeded":
            return Outcome("succeeded", result=job.result)
        if event.name == "job.failed":
            return Outcome(
                "failed", error_class=event.data.get("error_class"), error=event.data.get("error")
            )
        if event.name == "job.write_rejected":
            return Outcome(
                "incomplete", error="the attempt's final write was rejected (lease lost)"
            )
    return Outcome("incomplete", error="the attempt never settled (worker died or stalled)")


class RecordedWorld:
    """The ``World`` of dry-run and fork contexts: answers from the recording, sealed.

    ``fork_step``: recorded answers until that step starts, live (branch) state
    after it; past the fork point a call must match a recorded one by name and
    arguments, or a stub must be given, or it raises — never the real world.
    """

    def __init__(
        self,
        recording: Recording,
        *,
        fork_step: str | None = None,
        stubs: dict[str, Any] | None = None,
    ) -> None:
        self.recording = recording
        self.fork_step = fork_step
        self.stubs = stubs or {}
        self.reached_fork = False
        self._queues: dict[tuple[str, str], deque[TraceEvent]] = {}
        self._reads: dict[str, deque[int]] = {}
        for event in recording.events:
            key = self._key(event)
            if key is not None:
                self._queues.setdefault(key, deque()).append(event)
            if event.name == "state.read" and event.resource is not None:
                self._reads.setdefault(event.resource, deque()).append(event.resource_version or 0)
        self.missing: list[str] = []

    @staticmethod
    def _key(event: TraceEvent) -> tuple[str, str] | None:
        if event.name == "call":
            return ("call", str(event.data.get("call")))
        if event.name in EFFECT_OUTCOMES or event.name == "effect.failed":
            return ("effect", str(event.data.get("kind")))
        if event.name in ("clock.now", "random.random", "random.uuid"):
            return (event.name, event.name)
        if event.name == "cache.read":
            return ("cache.read", str(event.data.get("key")))
        return None

    is_live = False
    sealed = True

    def lease_lost(self) -> bool:
        return False

    @property
    def reads_recorded(self) -> bool:
        return not self.reached_fork

    @property
    def writes_apply(self) -> bool:
        return self.fork_step is None or self.reached_fork

    def on_step(self, name: str) -> None:
        if self.fork_step is not None and name == self.fork_step:
            self.reached_fork = True

    def state_version(self, resource: str) -> int | None:
        queue = self._reads.get(resource)
        return queue.popleft() if queue else None

    def answer(self, name: str, label: str, fingerprint: str) -> Any:
        queue = self._queues.get((name, label), deque())
        if self.reached_fork:
            return self._answer_live(name, label, fingerprint, queue)
        if not queue:
            self.missing.append(f"{name} {label!r}")
            raise ReplayDivergenceError(
                f"the recording has no {name} {label!r} here; a replay never reaches the real "
                "world, so it stops"
            )
        event = queue.popleft()
        if name == "call" and fingerprint != event.data.get("fingerprint"):
            self.missing.append(f"call {label!r} with other arguments")
            raise ReplayDivergenceError(
                f"call {label!r} was made with other arguments than recorded "
                f"(fingerprint {fingerprint} vs {event.data.get('fingerprint')}); "
                "the recording has no response for them"
            )
        if name == "effect" and fingerprint != event.data.get("key"):
            self.missing.append(f"effect {label!r} with key {fingerprint!r}")
            raise ReplayDivergenceError(
                f"effect {label!r} used key {fingerprint!r}, the recording used "
                f"{event.data.get('key')!r}"
            )
        if event.status == "fail":
            raise RecordedFailure(name, label, event.data.get("error"))
        return self._value(name, event)

    def _answer_live(
        self, name: str, label: str, fingerprint: str, queue: deque[TraceEvent]
    ) -> Any:
        # Past the fork point a recorded failure is no answer: the new code gets a stub or an error.
        for event in [e for e in queue if e.status != "fail"]:
            if name != "call" or event.data.get("fingerprint") == fingerprint:
                queue.remove(event)
                return self._value(name, event)
        if label in self.stubs:
            return self.stubs[label]
        if name == "effect":
            return None  # an intended effect: recorded by the context, never executed
        if name == "cache.read":
            return {"key": label, "hit": False}
        if name in ("clock.now", "random.random", "random.uuid"):
            raise ReplayDivergenceError(f"the fork asked for {name} past the recording; stub it")
        self.missing.append(f"{name} {label!r}")
        raise ReplayDivergenceError(
            f"fork: {name} {label!r} (fingerprint {fingerprint}) is not in the recording and no "
            f"stub was given (--stub {label}=JSON); a fork never reaches the real world"
        )

    def _value(self, name: str, event: TraceEvent) -> Any:
        if name == "call":
            return self.recording.value(event, "response")
        if name == "effect":
            return self.recording.value(event, "result")
        if name == "cache.read":
            return event.data.get("read")
        return event.data.get("value")
