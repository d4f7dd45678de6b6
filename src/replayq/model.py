"""The records every layer speaks in: jobs, their narrow set of states, trace events.

A job is ``queued`` → ``running`` → one of ``succeeded``, ``dead`` (the
investigation queue) or ``cancelled``. A retry is ``queued`` again with a later
``run_at``; an expired lease is ``queued`` again with ``redelivery_count + 1``.
See ``docs/state_machine.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """The five states a job can be in."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})


class DeadReason(StrEnum):
    """Why a job was parked in the investigation queue."""

    UNKNOWN_JOB_TYPE = "unknown_job_type"
    MALFORMED_PAYLOAD = "malformed_payload"
    NOT_RETRYABLE = "not_retryable"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    LEASE_EXPIRED_ATTEMPTS_EXHAUSTED = "lease_expired_attempts_exhausted"
    EFFECT_IN_DOUBT = "effect_in_doubt"
    # A write of replayq's own refused by a constraint of its own tables (``rq_*``): a bug
    # of replayq's, not the job's (``ConstraintViolationError.internal``).
    INTERNAL_ERROR = "internal_error"
    # The worker's start of the job raised on each of its last leases of it in a row while
    # it started other jobs meanwhile: the fault follows the job (``Executing._unstartable``).
    START_FAILED = "start_failed"


@dataclass(frozen=True)
class Job:
    """One job as stored. Immutable: use ``evolve`` for a changed copy."""

    id: int
    job_type: str
    queue: str
    payload: dict[str, Any]
    state: JobState
    priority: int
    run_at: float
    created_at: float
    attempt: int
    max_attempts: int
    trace_id: str
    message_id: str | None = None
    ordering_key: str | None = None
    idempotency_key: str | None = None
    handler_version: str | None = None
    owner_token: str | None = None
    worker_id: str | None = None
    leased_at: float | None = None
    lease_deadline: float | None = None
    redelivery_count: int = 0
    last_error_class: str | None = None
    last_error: str | None = None
    dead_reason: str | None = None
    result: Any = None
    finished_at: float | None = None
    hlc: int = 0
    correlation_id: str | None = None
    causation_id: str | None = None
    origin: str = "production"
    trace_context: str | None = None
    # When a cancel was asked of the job while it ran (``jobs cancel``); None if never.
    cancel_requested_at: float | None = None

    def evolve(self, **changes: Any) -> Job:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def built(cls, fields: dict[str, Any]) -> Job:
        """The job whose fields are exactly ``fields`` (the storage's reader names every
        one), without the frozen dataclass ``__init__``: one ``object.__setattr__`` per
        field, ~30 of them, for each job a lease returns. Like ``TraceEvent.built`` the job
        takes ``fields`` as its ``__dict__``, uncopied: the caller must not keep it.
        ``tests/conformance/test_job_rows.py`` checks that a job read back has every field
        and equals the one ``__init__`` builds."""
        job = object.__new__(cls)
        object.__setattr__(job, "__dict__", fields)
        return job

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for ``--json`` output."""
        body = dataclasses.asdict(self)
        body["state"] = self.state.value
        return body


@dataclass(frozen=True)
class TraceEvent:
    """One row of the trace: a lifecycle or domain event (fields of seed 000)."""

    trace_id: str
    name: str
    ts: float
    hlc: int
    job_id: int | None = None
    attempt: int | None = None
    kind: str = "lifecycle"
    seq: int | None = None
    step: str | None = None
    worker_id: str | None = None
    status: str | None = None
    resource: str | None = None
    resource_version: int | None = None
    side_effect: bool = False
    input_ref: str | None = None
    output_ref: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> TraceEvent:
        """The event with these fields, every one of them named.

        Skips the frozen dataclass ``__init__`` (one ``object.__setattr__`` per field,
        ~6 times slower): for the trace readers and the recording context, which build
        one event per row and per ``ctx`` call. The event is as frozen as any other.
        """
        assert fields.keys() == _EVENT_FIELDS, sorted(fields.keys() ^ _EVENT_FIELDS)
        event = object.__new__(cls)
        event.__dict__.update(fields)
        return event

    @classmethod
    def built(cls, fields: dict[str, Any]) -> TraceEvent:
        """``of`` for a dictionary literal in replayq's own code that names every field
        (the recording context, the trace-pack reader: one call per event): the event
        takes ``fields`` as its ``__dict__``, unchecked and uncopied, so the caller must
        not keep it. A conformance test (``test_context_recording``) checks that the events
        both build carry every field."""
        event = object.__new__(cls)
        set_event_dict(event, fields)
        return event


# ``TraceEvent``'s ``__dict__`` setter (``built``, ``Recorder._event``): the descriptor's
# own, not ``object.__setattr__``, which looks the name up on the type first (~400
# instructions an event).
set_event_dict = TraceEvent.__dict__["__dict__"].__set__
_EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(TraceEvent))


@dataclass(frozen=True)
class StatRow:
    """How many jobs of a type are in a state, and the oldest one's ``run_at``."""

    job_type: str
    state: str
    count: int
    oldest_run_at: float | None
