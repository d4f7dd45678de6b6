"""The quick check of a verification dry-run: the handler against its recording, no events.

A bulk dry-run that keeps nothing (``dry_run_many(..., keep=False)``, what ``rollout
verify`` runs) only needs to know whether each job still does what its recording
says. ``quick_check`` runs the handler with a ``QuickContext``: what a dry-run's
event would be compared on (``compare.signature``) is computed from each ``ctx``
verb's arguments and compared at once with the recorded event at the same position,
and the verb is answered from that event (what a dry-run's ``RecordedWorld`` answers)
— no trace event is built, no step commits, nothing is redacted or kept.

It answers only "the same as recorded" or "ask the full dry-run" (``None``):

* any mismatch (a signature, a decision value or a state delta that is not equal as
  ``compare_decisions`` / ``compare_writes`` compare them), a handler that raises,
  I/O that bypassed ``ctx`` (the run is sealed as a dry-run is), a ``ctx`` verb or
  attribute this context does not implement (locks, cache, outbox, child jobs,
  callable steps, async handlers...), a recording it does not cover (a recorded
  failure, skipped steps, locks, fencing rejections, in-doubt effects) — all end
  the quick run, and the caller runs the full dry-run on a freshly loaded recording,
  whose report is the one a dry-run gives;
* the values compared were the handler's own, not redacted ones: a match is kept
  only if the redactor finds nothing secret in any of them (``Redactor.clean_text``
  over all of them at the end), so that redacting them — what the full dry-run
  does before it compares — would have changed nothing.

The report of a match is the full dry-run's report of the same run, except that it
holds no events (``events_now`` empty, ``matched_in_memory`` true): they equal the
recording's on every field a comparison reads.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn

from replayq import codec
from replayq.errors import PayloadError, ReplayqError
from replayq.model import TraceEvent
from replayq.queue.handlers import Handler
from replayq.recording.aio import is_async
from replayq.recording.attempt import ended_error
from replayq.recording.calls import call_request
from replayq.recording.effects import default_effect_key
from replayq.recording.state import Entity, delta_of, resource_name
from replayq.recording.world import LIVE
from replayq.redaction import Redactor, keys_of
from replayq.replay.compare import ReplayReport, _canonical, signature
from replayq.replay.recorded import Outcome, Recording
from replayq.runtime import Runtime
from replayq.seal import seal

# What a quick run compares itself (signature kinds); a recording with any other compared
# event (locks, cache, outbox, child jobs, skipped steps, write rejections) is left to the
# full dry-run.
COVERED = frozenset(
    (
        "step",
        "step.end",
        "decision",
        "call",
        "effect",
        "state.read",
        "state.write",
        "clock.now",
        "random.random",
        "random.uuid",
    )
)
# Effect events a verification counts (``rollout.verify``) that carry no signature.
_UNCOVERED_EFFECTS = frozenset(("effect.refused", "effect.in_doubt", "effect.failed"))
_Signed = tuple[TraceEvent, tuple[Any, ...]]
# The data fields of the compared events whose values a quick run compares as they are: a
# redaction rule naming one of them would change what the full dry-run compares.
_FIELDS = (
    "step_name",
    "decision",
    "value",
    "why",
    "call",
    "fingerprint",
    "kind",
    "key",
    "delta",
    "set",
    "unset",
    "replace",
)


class QuickCheckStopped(ReplayqError):
    """The quick run cannot vouch for this job: the full dry-run decides.

    A handler that catches it and carries on changes nothing: the context remembers
    that it stopped (``QuickContext._stopped``)."""


def covered(recording: Recording) -> list[_Signed] | None:
    """The recording's compared events with their signatures, or ``None`` if a quick run
    cannot check it."""
    if recording.outcome.status != "succeeded":
        return None
    signed: list[_Signed] = []
    append = signed.append
    for event in recording.events:
        name = event.name
        # A step's start and end (most of a run's events) signed here, as ``signature``
        # signs them (as ``compare.Comparison`` does), without a call of it each.
        if name == "step.started":
            append((event, ("step", event.data.get("step_name"))))
            continue
        if name == "step.finished":
            append((event, ("step.end", event.data.get("step_name"), event.status)))
            continue
        if name in _UNCOVERED_EFFECTS:
            return None
        mark = signature(event)
        if mark is None:
            continue
        if mark[0] not in COVERED:
            return None
        append((event, mark))
    return signed


class _Step:
    __slots__ = ("ctx", "name")

    def __init__(self, ctx: QuickContext, name: str) -> None:
        self.ctx, self.name = ctx, name

    def __enter__(self) -> None:
        ctx = self.ctx
        ctx._expect(("step", self.name))
        ctx._names.append(self.name)
        ctx._steps.append(self.name)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        ctx = self.ctx
        ctx._steps.pop()
        if exc is not None:
            ctx._stop()  # a failed step: the full dry-run records and compares it
        ctx._expect(("step.end", self.name, "success"))


class _QuickState:
    """``ctx.state`` of a quick run: ``StateView.get``/``put`` as a dry-run runs them
    (versions and data from the recording), recording nothing."""

    def __init__(self, ctx: QuickContext) -> None:
        self._ctx = ctx
        self._read_versions: dict[tuple[str, str], int] = {}
        self._read: dict[tuple[str, str], Entity] = {}
        self._pending: dict[tuple[str, str], Entity] = {}

    def __getattr__(self, name: str) -> Any:
        self._ctx._stop()

    def get(self, namespace: str, key: Any) -> Entity:
        ctx, key = self._ctx, str(key)
        ident = (namespace, key)
        if ident in self._pending:
            return self._pending[ident]
        # As the recording names it: redacted (``Recorder._event``).
        resource = ctx.redactor.resource(resource_name(namespace, key))
        # A dry-run reads the version the attempt read: the recorded read at this position.
        event = ctx._peek()
        if event.name != "state.read" or event.resource != resource:
            ctx._stop()
        version = event.resource_version or 0
        held = ctx._recording.states.get((resource, version), LIVE) if version else None
        if held is LIVE:
            ctx._stop()  # not loaded with the recording: the full dry-run reads the database
        entity = Entity(namespace, key, version, held)
        self._read_versions[ident] = version
        self._read[ident] = entity
        ctx._expect(("state.read", resource, version))
        return entity

    def put(
        self, namespace: str, key: Any, data: Any, *, expected_version: int | None = None
    ) -> Entity:
        ctx, key = self._ctx, str(key)
        ident = (namespace, key)
        resource = ctx.redactor.resource(resource_name(namespace, key))
        pending = self._pending.get(ident)
        if expected_version is None:
            expected_version = pending.version if pending else self._read_versions.get(ident, -1)
        ctx._texts.append(ctx._checked(data))
        seen = self._read.get(ident)
        if seen is None and pending is None:
            ctx._stop()  # written unread: the full dry-run reads the head from the database
        actual = seen.version if seen is not None and seen.exists else 0
        base = pending.version if pending else actual
        if expected_version not in (-1, base):
            ctx._stop()  # a version conflict: the handler fails, the full dry-run says how
        if pending:
            previous = pending.data
        else:
            previous = seen.data if seen is not None and seen.exists else None
        if base > 0 and previous == data:
            return Entity(namespace, key, base, data)  # ``state.unchanged``: not compared
        delta = delta_of(previous, data)
        recorded = ctx._expect(("state.write", resource, _canonical(delta)))
        if recorded.data.get("delta") != delta:
            ctx._stop()  # ``compare_writes`` compares the values themselves
        if "unset" in delta:
            ctx._names.append(delta["unset"])  # field names of the recorded data
        entity = Entity(namespace, key, base + 1, data)
        self._pending[ident] = entity
        return entity


class QuickContext:
    """What the handler gets as ``ctx`` in a quick run (see the module's docstring).

    Implements the verbs a dry-run's context answers from the recording without a
    database: ``step`` (the ``with`` form), ``decide``, ``call``, ``effect``, ``now``,
    ``random``, ``uuid``, ``state.get`` / ``state.put`` and the job's identity. Any
    other attribute ends the quick run (the full dry-run takes over).
    """

    def __init__(
        self,
        recording: Recording,
        handler: Handler,
        signed: list[_Signed],
        *,
        trace_id: str,
        redactor: Redactor,
        blob_limit: int,
    ) -> None:
        self.handler = handler
        self._recording = recording
        self.redactor = redactor
        self._blob_limit = blob_limit
        self._steps: list[str] = []
        self._stopped = False
        self._signed = signed
        self._count = 0
        # What the handler's compared values hold, screened for secrets at the end
        # (``_finished``): names and keys, and the texts of the values already encoded.
        self._names: list[Any] = []
        self._texts: list[str] = []
        # The object keys of ``_texts`` (``None``: not known, searched in the text).
        self._keys: set[Any] | None = set()
        self._trace_id = trace_id
        self._state: _QuickState | None = None
        self._ended = False  # by ``_close``: a kept ctx then refuses, as ``Context.end``

    def __getattr__(self, name: str) -> Any:
        self._stop()

    def _close(self) -> None:
        """Drop the state view (it refers back to this context): without the cycle, a
        finished run and the recording it holds are freed at once, not by the cyclic
        garbage collector (which a bulk dry-run runs only between batches). The run is
        over: a ctx the handler kept refuses from here on (``ContextEndedError``, as a
        ``Context`` after ``end``), never the quick run's own ``QuickCheckStopped``."""
        self._state = None
        self._ended = True

    def _stop(self) -> NoReturn:
        if self._ended:
            raise ended_error(self.job_id, self.attempt)
        self._stopped = True
        raise QuickCheckStopped

    # -- comparing ----------------------------------------------------------------------------

    def _peek(self) -> TraceEvent:
        """The recorded event the next compared event must match."""
        if self._count >= len(self._signed) or self._ended:
            self._stop()  # the run does more than the recording
        return self._signed[self._count][0]

    def _expect(self, mark: tuple[Any, ...]) -> TraceEvent:
        """The next compared event would be ``mark``: stop unless the recording has it here.
        Returns the recorded event.

        The recorded event at this position is the one a dry-run's ``RecordedWorld``
        answers from: it answers each (verb, name) from the recording in order, and every
        answered event is compared, so while all match, the n-th answer of a name is the
        n-th recorded event of that name."""
        index = self._count
        signed = self._signed
        if index >= len(signed) or signed[index][1] != mark or self._ended:
            self._stop()  # ended: ``ContextEndedError``, whatever the recording has here
        self._count = index + 1
        return signed[index][0]

    def _checked(self, value: Any) -> str:
        """``value``'s canonical text, as ``Context.encoded`` checks it (JSON only, under
        the blob limit); the quick run stops where the full one would raise."""
        try:
            # The same text as ``codec.dumps``, and the keys of its objects, found by the
            # walk that judges the value (``_finished`` screens them without a regex).
            text, keys = codec.dumps_keyed(value)
        except PayloadError:
            self._stop()
        if len(text.encode()) > self._blob_limit:
            self._stop()
        if keys is None:
            self._keys = None
        elif self._keys is not None:
            self._keys |= keys
        return text

    def _finished(self) -> bool:
        """Whether the run did everything the recording did, with nothing secret compared."""
        if self._stopped or self._steps or self._count != len(self._signed):
            # Stopped, a step left open (a generator suspended in it: the full dry-run's
            # handler fails there), or not everything the recording did.
            return False
        redactor = self.redactor
        if redactor.any_secret_field(_FIELDS):
            return False
        try:
            names = codec.dumps_own(self._names)
        except PayloadError:
            return False
        # The object keys of that text: the values' (``_checked``) and the names' (``None``:
        # ``clean_text`` finds them in the text itself, as it did for all of it).
        keys = self._keys
        if keys is not None:
            named = keys_of(self._names)
            keys = None if named is None else keys | named
        # One JSON text (a list) of everything compared: clean as a whole, clean in each part.
        return redactor.clean_text("[" + ",".join([names, *self._texts]) + "]", keys)

    # -- the job ------------------------------------------------------------------------------

    @property
    def job_id(self) -> int:
        return self._recording.job.id

    @property
    def attempt(self) -> int:
        return self._recording.attempt

    @property
    def trace_id(self) -> str:
        return self._trace_id

    @property
    def version(self) -> str:
        return self.handler.contract.version

    @property
    def payload(self) -> dict[str, Any]:
        return self._recording.job.payload

    @property
    def current_step(self) -> str | None:
        return self._steps[-1] if self._steps else None

    lease_lost = False

    @property
    def cancelled(self) -> bool:
        """False during the run; True once it is over (``_close``), as ``Context.cancelled``
        after ``end``: a loop that polls it stops."""
        return self._ended

    def check_cancelled(self) -> None:
        if self._ended:
            raise ended_error(self.job_id, self.attempt)

    # -- verbs --------------------------------------------------------------------------------

    @property
    def state(self) -> _QuickState:
        if self._state is None:
            if self._ended:
                raise ended_error(self.job_id, self.attempt)
            self._state = _QuickState(self)
        return self._state

    def step(
        self, name: str, fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any
    ) -> Any:
        if fn is not None:
            self._stop()  # a callable step (resume, its result): the full dry-run
        return _Step(self, name)

    def decide(self, name: str, value: Any, **why: Any) -> Any:
        self._texts.append(self._checked({"value": value, "why": why}))
        recorded = self._expect(("decision", name, _canonical(value)))
        if recorded.data.get("value") != value:
            self._stop()  # ``compare_decisions`` compares the values themselves
        self._names.append(name)
        return value

    def _answered(self, mark: tuple[Any, ...], key: str) -> Any:
        """The recorded answer at this position (``RecordedWorld.answer``): its value, or
        stop at a recorded failure."""
        event = self._expect(mark)
        if event.status == "fail":
            self._stop()  # the recorded failure again: the full dry-run reports it
        if key == "value":
            return event.data.get("value")
        return self._recording.value(event, key)

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if is_async(fn):
            self._stop()
        text = self._checked(call_request(args, kwargs))
        fingerprint = codec.fingerprint_text(text)
        self._texts.append(text)
        self._names += (name, fingerprint)
        return self._answered(("call", name, fingerprint), "response")

    def effect(self, kind: str, fn: Callable[[], Any], *, key: str | None = None) -> Any:
        if is_async(fn):
            self._stop()
        if not key:
            key = default_effect_key(self.handler, self._recording.job, kind)
            if key is None:
                self._stop()
        self._names += (kind, key)
        return self._answered(("effect", kind, key), "result")

    def now(self) -> float:
        return float(self._answered(("clock.now",), "value"))

    def random(self) -> float:
        return float(self._answered(("random.random",), "value"))

    def uuid(self) -> str:
        return str(self._answered(("random.uuid",), "value"))


def quick_check(
    runtime: Runtime, recording: Recording, handler: Handler, names: tuple[str, str]
) -> ReplayReport | None:
    """The report of a sealed dry-run (I/O refused) that found the job the same as
    recorded, checked without building its events; ``None`` when the full dry-run must
    decide (see the module). ``names``: the derived trace id and branch the report names."""
    signed = covered(recording)
    if signed is None or handler.is_async or handler.contract.lock is not None:
        return None
    trace_id, branch = names
    ctx = QuickContext(
        recording,
        handler,
        signed,
        trace_id=trace_id,
        redactor=handler.redactor or runtime.redactor,
        blob_limit=runtime.limits.blob_limit_bytes,
    )
    with seal(step=lambda: ctx.current_step, allow_io=False) as sealed:
        try:
            args = handler.shape.decode(handler.contract.name, recording.job.payload)
            fn = handler.fn
            result = fn(ctx, *args) if isinstance(args, tuple) else fn(ctx, **args)
        except Exception:  # not vouched for (stopped), the handler failed, I/O was refused
            return None
        finally:
            ctx._close()
    if sealed.violations or not ctx._finished():
        return None
    return ReplayReport(
        mode="replay",
        job_id=recording.job.id,
        attempt=recording.attempt,
        trace_id=trace_id,
        source_trace_id=recording.job.trace_id,
        version=handler.contract.version,
        branch=branch,
        outcome_recorded=recording.outcome,
        outcome_now=Outcome("succeeded", result=result),
        matched_in_memory=True,
    )
