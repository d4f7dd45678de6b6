"""Putting jobs on the queue: one insert and its ``job.enqueued`` event, in one transaction."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.durations import Duration, parse_duration
from replayq.errors import ConfigurationError, PayloadError, ReplayqError, UnknownJobTypeError
from replayq.model import Job, TraceEvent
from replayq.queue import lifecycle
from replayq.queue.catalog import active_contract
from replayq.queue.contracts import Retry, render_template, template_fields
from replayq.redaction import Redactor
from replayq.runtime import Runtime
from replayq.storage.protocol import JobInsert, Transaction


def new_trace_id(now: float) -> str:
    """A 32-hex-digit id that sorts by creation time (48-bit ms prefix, 80 random bits).

    Time-ordered ids keep the trace index's inserts on its last pages instead of
    a random page per job. The random part is 10 bytes of ``os.urandom``: what
    ``uuid4`` draws from, without building a ``UUID`` (~3 µs of each enqueue).
    """
    return f"{int(now * 1000) & 0xFFFFFFFFFFFF:012x}{os.urandom(10).hex()}"


@dataclass(frozen=True)
class EnqueueRequest:
    """One job to enqueue, for ``App.enqueue_many``."""

    job_type: str
    # A JSON object, or the dataclass / pydantic model the handler declares as its payload.
    payload: Any = field(default_factory=dict)
    message_id: str | None = None
    delay: Duration | None = None
    run_at: float | None = None
    priority: int = 0


def _checked_payload(runtime: Runtime, request: EnqueueRequest) -> str:
    """The JSON of a payload no declared handler checks: an object, under the size limit."""
    if not isinstance(request.payload, dict):
        raise PayloadError("payload must be a JSON object")
    payload_json = codec.dumps(request.payload, what=f"{request.job_type} payload")
    if len(payload_json.encode()) > runtime.limits.unchecked_max_payload_bytes:
        raise PayloadError(
            f"payload is above the {runtime.limits.unchecked_max_payload_bytes} bytes allowed "
            "for job types this app does not declare"
        )
    return payload_json


def _redacted(redactor: Redactor, payload: Any, text: str) -> tuple[Any, str]:
    """``payload`` and its JSON with secrets replaced (the same objects if it has none)."""
    redacted = redactor.value(payload)
    return (payload, text) if redacted is payload else (redacted, codec.dumps(redacted))


def insert_job(
    runtime: Runtime,
    tx: Transaction,
    request: EnqueueRequest,
    *,
    queue: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    origin: str = "production",
    check: bool = True,
    require_contract: bool = False,
    trace_context: str | None = None,
) -> int:
    """Insert one job inside ``tx`` (with its ``job.enqueued`` event); returns its id.

    A type this app does not declare (``check=False``) is enqueued under the stored
    contract of its active version; with ``require_contract`` a type with no stored
    contract is refused rather than enqueued under defaults.
    """
    params = _job_params(
        runtime,
        tx,
        request,
        queue=queue,
        correlation_id=correlation_id,
        causation_id=causation_id,
        origin=origin,
        check=check,
        require_contract=require_contract,
        trace_context=trace_context,
    )
    ((job_id, created),) = tx.job_enqueue([params])
    if not created:
        tx.trace_append([_deduplicated_event(tx, params, job_id)])
    return job_id


def enqueue_job(runtime: Runtime, request: EnqueueRequest, **options: Any) -> int:
    """``insert_job`` in a transaction of its own (``App.enqueue`` without ``conn``).

    Where the storage can commit a statement by itself (``protocol.Autocommit``: both
    backends) and the type is declared here (its row needs no read), the row and its
    ``job.enqueued`` pack are that one statement, instead of ``BEGIN``, it, ``COMMIT``:
    one round trip on PostgreSQL; on SQLite the insert keeps the pack in the job's row
    (migration 0023). A duplicate ``message_id`` wrote nothing; its ``job.deduplicated``
    goes in after, in a transaction that asks again (the job it met may have been deleted
    meanwhile, by gc: then the message id is free, and this request's job is inserted
    there).
    """
    storage = runtime.storage
    # ``getattr``, not ``isinstance(storage, Autocommit)``: a protocol check costs ~10 µs.
    autocommit: Callable[[], AbstractContextManager[Transaction]] | None = getattr(
        storage, "autocommit", None
    )
    if autocommit is None or not runtime.registry.declares(request.job_type):
        with storage.transaction() as tx:
            return insert_job(runtime, tx, request, **options)
    with autocommit() as tx:
        params = _job_params(runtime, tx, request, **options)
        job_id: int
        ((job_id, created),) = tx.job_enqueue([params])
    if not created:
        with storage.transaction() as tx:
            ((job_id, created),) = tx.job_enqueue([params])
            if not created:
                tx.trace_append([_deduplicated_event(tx, params, job_id)])
    return job_id


def insert_jobs(runtime: Runtime, tx: Transaction, requests: Sequence[EnqueueRequest]) -> list[int]:
    """``insert_job`` for many requests inside ``tx``, set-based: every row and every
    ``job.enqueued`` event in one statement on PostgreSQL (on SQLite one insert per row,
    then one for all the events).

    Ids follow the requests' order; a request whose ``message_id`` an earlier one (or an
    existing job) took gets that job's id and a ``job.deduplicated`` event, as one by one.
    """
    params = [_job_params(runtime, tx, request) for request in requests]
    inserted = tx.job_enqueue(params)
    duplicates = [
        _deduplicated_event(tx, p, job_id)
        for p, (job_id, created) in zip(params, inserted, strict=True)
        if not created
    ]
    if duplicates:
        tx.trace_append(duplicates)
    return [job_id for job_id, _ in inserted]


def _deduplicated_event(tx: Transaction, params: JobInsert, job_id: int) -> TraceEvent:
    """``job.deduplicated`` on the existing job that ``params``' message id names."""
    job = tx.job_get(job_id)
    assert job is not None
    return lifecycle.lifecycle(
        lifecycle.JOB_DEDUPLICATED,
        job,
        now=params.now,
        hlc=params.hlc,
        message_id=params.message_id,
        rule="same message_id yields the existing job",
    )


# A job's priority is a 32-bit integer column on PostgreSQL; the same bounds on SQLite.
_PRIORITY_MIN, _PRIORITY_MAX = -(2**31), 2**31 - 1
# The latest run_at (a POSIX time in seconds, ~31 million years ahead) and the earliest:
# a finite number whose shortest exact text every backend writes and reads back unchanged.
_RUN_AT_LIMIT = 1e15


def _scheduled_at(request: EnqueueRequest, now: float) -> float:
    """The ``run_at`` of ``request``'s row from its ``run_at`` or ``delay``, refused with a
    ``ConfigurationError`` unless it is a finite time (seconds since the epoch)."""
    if request.run_at is not None and request.delay is not None:
        raise ConfigurationError("give either delay or run_at, not both")
    if request.delay is not None:
        run_at = now + parse_duration(request.delay, name="delay")
    else:
        given = request.run_at
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise ConfigurationError(
                f"run_at must be a POSIX time in seconds (a number), got {given!r}"
            )
        run_at = float(given)
    if not -_RUN_AT_LIMIT < run_at < _RUN_AT_LIMIT:  # also false for NaN
        source = f"delay {request.delay!r} gives" if request.delay is not None else "got"
        raise ConfigurationError(
            f"run_at must be a finite time within {_RUN_AT_LIMIT:.0e} seconds of the epoch; "
            f"{source} {run_at!r}"
        )
    return run_at


def _checked_priority(priority: Any) -> int:
    """``priority`` as an ``int`` (an ``IntEnum`` member is one), refused unless whole and
    within the column's bounds."""
    whole = isinstance(priority, int) and not isinstance(priority, bool)
    if whole and _PRIORITY_MIN <= priority <= _PRIORITY_MAX:
        return int(priority)
    raise ConfigurationError(
        f"priority must be a whole number from {_PRIORITY_MIN} to {_PRIORITY_MAX}, got {priority!r}"
    )


def _job_params(
    runtime: Runtime,
    tx: Transaction,
    request: EnqueueRequest,
    *,
    queue: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    origin: str = "production",
    check: bool = True,
    require_contract: bool = False,
    trace_context: str | None = None,
) -> JobInsert:
    """The row to insert for ``request``: its payload checked and redacted, its keys
    rendered, its contract's attempt budget and queue."""
    now = runtime.clock.now()
    run_at = now
    if request.run_at is not None or request.delay is not None:
        run_at = _scheduled_at(request, now)
    priority = request.priority
    if type(priority) is not int or not _PRIORITY_MIN <= priority <= _PRIORITY_MAX:
        priority = _checked_priority(priority)
    registry = runtime.registry
    handler = registry.declared(request.job_type)
    if handler is None and check:
        raise UnknownJobTypeError(
            f"no handler is registered for job type {request.job_type!r}; "
            f"declared: {', '.join(registry.job_types()) or 'none'}"
        )
    stored = None if handler is not None else active_contract(runtime, tx, request.job_type)
    if handler is None and stored is None and require_contract:
        raise UnknownJobTypeError(
            f"no stored contract for job type {request.job_type!r}, so its ordering key, "
            "idempotency key and attempt budget are unknown; start a worker that declares it "
            "(contracts are stored when a worker starts) or give --app module:app"
        )
    # Secrets never reach the database: the payload is stored, and keys are rendered,
    # with its secret fields replaced by their markers (``replayq.redaction``). A declared
    # type's rules are its handler's, without looking it up again.
    if handler is not None:
        redactor = runtime.redactor_of(handler)
    else:
        redactor = runtime.redactor_for(request.job_type)
    payload = request.payload
    if handler is not None:
        # Keys are rendered from the JSON form: one text per value, whatever object was
        # passed, and a field the payload leaves out as the default the handler receives.
        plain, payload_json = handler.prepare_payload(payload, redactor)
        plain, payload_json = _redacted(redactor, plain, payload_json)
        contract, keys = handler.contract, handler.keys
        max_attempts = contract.retry.max_attempts
        ordering_key = None if keys.ordering is None else keys.ordering.render(plain)
        idempotency_key = None if keys.idempotency is None else keys.idempotency.render(plain)
        job_queue = queue or contract.queue
    elif stored is not None:
        # A type this process does not declare: the stored contract of its active version.
        payload_json = _checked_payload(runtime, request)
        for label, template in (("ordering", stored.ordering), ("idempotency", stored.idempotency)):
            missing = [f for f in template_fields(template or "") if f not in request.payload]
            if missing:
                raise PayloadError(
                    f"{request.job_type} {stored.version}: the {label} key {template!r} needs "
                    f"payload field(s) {', '.join(missing)}"
                )
        payload, payload_json = _redacted(redactor, payload, payload_json)
        max_attempts = stored.retry.max_attempts
        ordering_key = render_template(stored.ordering, payload)
        idempotency_key = render_template(stored.idempotency, payload)
        job_queue = queue or stored.queue
    else:
        payload_json = _checked_payload(runtime, request)
        payload, payload_json = _redacted(redactor, payload, payload_json)
        max_attempts, ordering_key, idempotency_key = Retry().max_attempts, None, None
        job_queue = queue or "default"
    hlc = runtime.hlc.tick()
    return JobInsert(
        job_type=request.job_type,
        queue=job_queue,
        payload_json=payload_json,
        priority=priority,
        run_at=run_at,
        now=now,
        max_attempts=max_attempts,
        trace_id=new_trace_id(now),
        hlc=hlc,
        message_id=request.message_id,
        ordering_key=ordering_key,
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
        causation_id=causation_id,
        origin=origin,
        trace_context=trace_context,
    )


def get_job(runtime: Runtime, job_id: int) -> Job:
    """The job with this id; ``ReplayqError`` if there is none."""
    with runtime.storage.transaction(readonly=True) as tx:
        job = tx.job_get(job_id)
    if job is None:
        raise ReplayqError(f"no job with id {job_id}")
    return job
