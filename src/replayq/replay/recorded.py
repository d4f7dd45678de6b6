"""A recorded attempt, read back from the trace, and the answers it gives a replay.

``Recording`` holds one attempt's domain events (large values resolved from the
blob store) and its outcome. ``RecordedWorld`` is the ``World`` a
replaying context consults: calls, effects, clock and random reads and cache
reads come from the recording, in order; a step the attempt skipped (it had
committed in an earlier attempt) is skipped again with its recorded result; a
call or effect that failed in the recording raises its failure again, with the
recorded class and message (``recorded_failure``); locks return what they
returned (acquired with which fencing token, timed out, released or expired) and
a state write that fencing rejected is rejected again. Anything the recording
lacks raises
``ReplayDivergenceError`` (deny by default) or, after a fork point, returns an
explicit stub; an effect the recording lacks is never made up.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from replayq.errors import (
    FailureClass,
    ReplayDivergenceError,
    ReplayqError,
    classify,
    internal_error_message,
    internal_violation,
    recorded_failure,
)
from replayq.model import DeadReason, Job, TraceEvent
from replayq.recording.blobs import load_json
from replayq.recording.ledger import CompletedStep
from replayq.recording.state import MAIN, version_from_row
from replayq.recording.world import LIVE
from replayq.redaction import NONE, Redactor
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import EntityGet, TraceJobs, Transaction

EFFECT_OUTCOMES = ("effect.succeeded", "effect.deduplicated", "effect.replayed")
LOCK_EVENTS = {
    "acquire": ("lock.acquired", "lock.timeout"),
    "release": ("lock.released", "lock.expired"),
}
LOCK_ACTION = {name: action for action, names in LOCK_EVENTS.items() for name in names}
# The events whose answers ``RecordedWorld.answer`` hands out in order (see ``_key``).
ANSWERED = frozenset(
    ("call", "effect.failed", "clock.now", "random.random", "random.uuid", "cache.read")
) | frozenset(EFFECT_OUTCOMES)
UNRECORDED_EFFECT = (
    "effect not in the recording: stub it with --stub {kind}=JSON or run it with "
    "rerun --allow-effects {kind}"
)


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


def as_redacted_now(outcome: Outcome, redactor: Redactor) -> Outcome:
    """The recorded ``outcome`` with its message redacted by ``redactor`` (the job type's
    rules of today), to be compared with a replay's, which ``failed_outcome`` redacts so:
    a message the worker stored in clear (a rule added since, or recorded before replayq
    redacted job errors) would otherwise read as a divergence of the same failure, and be
    shown in clear in the report. A marker already in it is left as it is."""
    error = outcome.error
    if error is None:
        return outcome
    redacted = redactor.text(error)
    return outcome if redacted == error else replace(outcome, error=redacted)


def failed_outcome(
    exc: BaseException, error_map: dict[type[BaseException], FailureClass], redactor: Redactor
) -> Outcome:
    """The outcome of an execution that raised ``exc``, as the worker records a failed
    attempt (``Outcomes._fail``): a constraint of replayq's own tables refusing replayq's
    own write is replayq's bug, class ``unknown`` with ``internal_error_message``, whatever
    the contract maps; any other failure its class (``error_map``: the contract's) and
    ``Type: message``. The message redacted by ``redactor`` (the job type's rules), as the
    worker's is: it goes into the derived trace and the report. A replay's and a rerun's
    alike."""
    internal = internal_violation(exc)
    if internal is not None:
        return Outcome(
            "failed", error_class="unknown", error=redactor.text(internal_error_message(internal))
        )
    failure = classify(exc, error_map)
    return Outcome("failed", error_class=failure.value, error=redactor.error(exc))


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
    # The data of each entity version the attempt read, by (resource, version), loaded with
    # the events so that a dry-run reads no state of its own.
    states: dict[tuple[str, int], Any] = field(default_factory=dict)

    def value(self, event: TraceEvent, key: str) -> Any:
        """A recorded value of an event, read from the blob store when it was large."""
        if event.output_ref is not None and event.id in self.values:
            return self.values[event.id]
        return event.data.get(key)


_SEQ = operator.attrgetter("seq")
_SEQ_HLC = operator.attrgetter("seq", "hlc")


def attempts_with_events(events: list[TraceEvent]) -> list[int]:
    return sorted({e.attempt for e in events if e.kind == "domain" and e.attempt})


def load_recording(source: RuntimeSource, job_id: int, attempt: int | None = None) -> Recording:
    """Read a job's attempt (default: the last one that recorded domain events).

    One read transaction: the job, its events, their blobs, the state versions read.
    """
    with source.runtime.storage.transaction(readonly=True) as tx:
        return read_recording(tx, job_id, attempt)


def load_recordings(
    source: RuntimeSource, job_ids: Sequence[int]
) -> list[Recording | ReplayqError]:
    """The last recorded attempt of each job, all read in one read transaction.

    The jobs' events come from one query (``trace_jobs``). In the order given; a job that
    cannot be replayed (missing, nothing recorded) is its error in place of its
    recording, so one bad job does not stop a batch.
    """
    found: list[Recording | ReplayqError] = []
    with source.runtime.storage.transaction(readonly=True) as tx:
        traces = {
            found.job_id: found.events
            for found in tx.trace_query(TraceJobs(list(dict.fromkeys(job_ids)), enqueued=False))
        }
        for job_id in job_ids:
            try:
                found.append(read_recording(tx, job_id, events=traces.get(job_id, [])))
            except ReplayqError as exc:
                found.append(exc)
    return found


def read_recording(
    tx: Transaction,
    job_id: int,
    attempt: int | None = None,
    *,
    events: list[TraceEvent] | None = None,
) -> Recording:
    """``load_recording`` inside an open transaction (``events``: the job's, read already)."""
    found = tx.job_get(job_id)
    if found is None:
        raise ReplayqError(f"no job with id {job_id}")
    job = found
    if events is None:
        # Its attempts' events: not its ``job.enqueued`` (attempt 0), which no attempt is.
        traces = tx.trace_query(TraceJobs([job_id], enqueued=False))
        events = traces[0].events if traces else []
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
    domain: list[TraceEvent] = []
    lifecycle: list[TraceEvent] = []
    for event in events:
        if event.attempt == attempt:
            if event.kind == "domain":
                domain.append(event)
            elif event.kind == "lifecycle":
                lifecycle.append(event)
    if None in map(_SEQ, domain):
        domain.sort(key=lambda e: (e.seq or 0, e.hlc))
    else:  # every domain event numbered (as the recorder numbers them): the key read in C
        domain.sort(key=_SEQ_HLC)
    states = _read_states(tx, domain, attempt)
    leased = [e.hlc for e in lifecycle if e.name == "job.leased"]
    # The last lease of the attempt started it: one before it was given back unstarted.
    start_hlc = leased[-1] if leased else (domain[0].hlc - 1)
    outcome = outcome_of(job, lifecycle)
    return Recording(job, attempt, domain, lifecycle, outcome, start_hlc, values, states)


def with_resources_redacted(recording: Recording, redactor: Redactor) -> Recording:
    """``recording`` with its events' resources as this release stores them
    (``Redactor.resource``): one an earlier release stored in clear (``card:4111…``) is
    compared with and answered as the replay's own, redacted, name. The same recording
    when none changes (the usual case: a set look-up an event that names a resource)."""
    clean = redactor._clean_resources
    events = recording.events
    changed: list[TraceEvent] | None = None
    for at, event in enumerate(events):
        resource = event.resource
        if resource is None or resource in clean:
            continue
        redacted = redactor.resource(resource)
        if redacted != resource:
            if changed is None:
                changed = list(events)
            changed[at] = TraceEvent.built({**vars(event), "resource": redacted})
    return recording if changed is None else replace(recording, events=changed)


def _read_states(
    tx: Transaction, events: list[TraceEvent], attempt: int | None
) -> dict[tuple[str, int], Any]:
    """The data of the entity versions the attempt's ``state.read`` events name (main branch).

    A resource whose namespace holds a ``:`` may split wrongly; its version is then simply
    not found here and the replay reads it from the database as before. So is a redacted
    one (``card:[redacted:…]``), but in an imported case's database, where the exported
    version was stored under that name (``export._written_version``): the replay then
    reads it by the handler's own key (``RecordedWorld``).
    """
    states: dict[tuple[str, int], Any] = {}
    for event in events:
        if event.name != "state.read" or event.kind != "domain" or not event.resource_version:
            continue
        if attempt is not None and event.attempt != attempt:
            continue
        resource, version = event.resource or "", int(event.resource_version)
        if (resource, version) in states or ":" not in resource:
            continue
        namespace, _, key = resource.partition(":")
        row = tx.entity_get(EntityGet(MAIN, namespace, key, version=version))
        if row is not None:
            states[(resource, version)] = version_from_row(tx, row, delta=False).data
    return states


def outcome_of(job: Job, lifecycle: list[TraceEvent]) -> Outcome:
    """How the recorded attempt ended, read from its lifecycle events (the last that says)."""
    for event in reversed(lifecycle):
        if event.name == "job.succeeded":
            return Outcome("succeeded", result=job.result)
        if event.name == "job.failed" or (
            event.name == "job.dead" and event.data.get("reason") == DeadReason.INTERNAL_ERROR
        ):
            # A park as ``internal_error`` (``Outcomes._park_internal``: its settle or its
            # reaping refused by replayq's own tables) has no ``job.failed``: its ``job.dead``
            # carries the class and message the worker recorded (``job.failed``'s, if any).
            return Outcome(
                "failed", error_class=event.data.get("error_class"), error=event.data.get("error")
            )
        if event.name == "job.write_rejected":
            return Outcome(
                "incomplete", error="the attempt's final write was rejected (lease lost)"
            )
        if event.name == "lease.released":
            fault = event.data.get("storage_fault")
            why = (
                f"the queue's database was unavailable ({fault})"
                if fault
                else "the worker stopped first"
            )
            return Outcome("incomplete", error=f"the attempt was put back unsettled: {why}")
    return Outcome("incomplete", error="the attempt never settled (worker died or stalled)")


class RecordedWorld:
    """The ``World`` of dry-run and fork contexts: answers from the recording, sealed.

    ``fork_step``: recorded answers until that step starts, live (branch) state
    after it; past the fork point a call must match a recorded one by name and
    arguments, or a stub must be given, or it raises — never the real world.

    ``redactor``: the job type's rules, as the recording was redacted by. The recording
    names resources and keys redacted (``card:[redacted:…]``) where the handler names
    them as they are: each is looked up redacted (``Redactor.resource``), and the state
    it names is read by the handler's own key (``recorded_state``'s ``LIVE``).
    """

    def __init__(
        self,
        recording: Recording,
        *,
        fork_step: str | None = None,
        stubs: dict[str, Any] | None = None,
        redactor: Redactor = NONE,
    ) -> None:
        self.recording = recording
        self._recorded = redactor.resource
        self.fork_step = fork_step
        self.stubs = stubs or {}
        self.reached_fork = False
        self._queues: dict[tuple[str, str], deque[TraceEvent]] = {}
        self._reads: dict[str, deque[int]] = {}
        self._locks: dict[tuple[str, str], deque[TraceEvent]] = {}
        self._writes: dict[str, deque[dict[str, Any] | None]] = {}
        self._skipped: dict[str, CompletedStep] = {}
        for event in recording.events:
            name = event.name
            if name == "step.skipped":
                position = str(event.data.get("step_key"))
                self._skipped[position] = CompletedStep(
                    key=position,
                    name=str(event.data.get("step_name")),
                    attempt=int(event.data.get("completed_in") or 0),
                    result=recording.value(event, "result"),
                    result_ref=event.output_ref,
                )
                continue
            key = self._key(event) if name in ANSWERED else None
            if key is not None:
                self._queues.setdefault(key, deque()).append(event)
                continue
            resource = event.resource
            if resource is None:
                continue
            if name == "state.read":
                self._reads.setdefault(resource, deque()).append(event.resource_version or 0)
            elif name in LOCK_ACTION:
                self._locks.setdefault((LOCK_ACTION[name], resource), deque()).append(event)
            elif name == "state.write":
                self._writes.setdefault(resource, deque()).append(None)
            elif name == "state.write_rejected" and resource in self._writes:
                # Fencing refused the last write of this resource at its step's commit.
                self._writes[resource][-1] = dict(event.data)
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

    def completed_step(self, key: str) -> CompletedStep | None:
        # What the recorded attempt skipped, it skips again, fork point or not: the step
        # had committed before that attempt started, so no version of the code reruns it.
        return self._skipped.get(key)

    def state_version(self, resource: str) -> int | None:
        queue = self._reads.get(self._recorded(resource))
        return queue.popleft() if queue else None

    def recorded_state(self, resource: str, version: int) -> Any:
        return self.recording.states.get((self._recorded(resource), version), LIVE)

    def lock_outcome(self, action: str, resource: str) -> dict[str, Any]:
        """What the recorded attempt's lock ``action`` on ``resource`` returned.

        A replay takes no real lock; it is told what the lock did. Past a fork
        point, or where the recording has no such lock, the lock is taken (released)
        without a fencing token.
        """
        queue = self._locks.get((action, self._recorded(resource)))
        if self.reached_fork or not queue:
            name = LOCK_EVENTS[action][0]
            return {"event": name, "fencing_token": None}
        event = queue.popleft()
        return {"event": event.name, **event.data}

    def write_rejection(self, resource: str) -> dict[str, Any] | None:
        """How fencing rejected this write of ``resource`` when recorded (``None``: it did not)."""
        queue = self._writes.get(self._recorded(resource))
        if self.reached_fork or not queue:
            return None
        return queue.popleft()

    def answer(self, name: str, label: str, fingerprint: str) -> Any:
        # The recording's labels (a call's name, an effect's kind, a cache key) and an
        # effect's key are its events' data: redacted, as the handler's are not.
        queue = self._queues.get((name, self._recorded(label))) or deque()
        if name == "effect":
            fingerprint = self._recorded(fingerprint)
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
            raise recorded_failure(
                name, label, event.data.get("error"), event.data.get("error_class")
            )
        return self._value(name, event)

    def _answer_live(
        self, name: str, label: str, fingerprint: str, queue: deque[TraceEvent]
    ) -> Any:
        """Past the fork point: a matching recorded answer, else a stub, else a divergence.

        A recorded success matching the request is returned; a stub given for
        ``label`` comes next; a recorded failure matching the request fails again (the
        world said no then, and a fork does not get to assume it says yes now).
        """

        def matches(event: TraceEvent) -> bool:
            if name == "call":
                return event.data.get("fingerprint") == fingerprint
            if name == "effect":
                return event.data.get("key") == fingerprint
            return True

        for event in [e for e in queue if e.status != "fail"]:
            if matches(event):
                queue.remove(event)
                return self._value(name, event)
        if label in self.stubs:
            return self.stubs[label]
        for event in [e for e in queue if e.status == "fail"]:
            if matches(event):
                queue.remove(event)
                raise recorded_failure(
                    name, label, event.data.get("error"), event.data.get("error_class")
                )
        if name == "cache.read":
            return {"key": label, "hit": False}
        if name in ("clock.now", "random.random", "random.uuid"):
            raise ReplayDivergenceError(f"the fork asked for {name} past the recording; stub it")
        self.missing.append(f"{name} {label!r}")
        if name == "effect":
            raise ReplayDivergenceError(
                f"fork: effect {label!r} (key {fingerprint!r}): "
                + UNRECORDED_EFFECT.format(kind=label)
            )
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
