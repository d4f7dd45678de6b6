"""The facade: declare job types with their contracts, enqueue, inspect, run workers."""

from __future__ import annotations

import inspect
import os
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replayq import codec, trace
from replayq.blobs import DEFAULT_BLOB_LIMIT_BYTES
from replayq.cache import CacheBackend, open_cache
from replayq.clock import Clock, HybridLogicalClock, SystemClock
from replayq.contracts import JobContract, Retry, build_contract, render_template
from replayq.durations import Duration, parse_duration
from replayq.errors import (
    ConfigurationError,
    ContractError,
    FailureClass,
    PayloadError,
    ReplayqError,
    SchemaError,
    UnknownJobTypeError,
)
from replayq.handlers import Handler, PayloadShape
from replayq.jobs import Job
from replayq.state import StateStore
from replayq.storage import open_storage
from replayq.storage.migrate import pending
from replayq.storage.protocol import JobFilter, JobInsert, Storage, TraceEvent, Transaction

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "sqlite:///replayq.db"
# The lifecycle events a resource timeline shows for the jobs that touched the resource.
RESOURCE_LIFECYCLE = frozenset(
    {
        trace.JOB_LEASED,
        trace.LEASE_EXPIRED,
        trace.LEASE_LOST,
        trace.JOB_REDELIVERED,
        trace.RETRY_SCHEDULED,
        trace.JOB_SUCCEEDED,
        trace.JOB_FAILED,
        trace.JOB_DEAD,
        trace.WRITE_REJECTED,
    }
)
UNCHECKED_MAX_PAYLOAD_BYTES = 256 * 1024


def new_trace_id(now: float) -> str:
    """A 32-hex-digit id that sorts by creation time (48-bit ms prefix, 80 random bits).

    Time-ordered ids keep the trace index's inserts on its last pages instead of
    a random page per job.
    """
    return f"{int(now * 1000) & 0xFFFFFFFFFFFF:012x}{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class EnqueueRequest:
    """One job to enqueue, for ``App.enqueue_many``."""

    job_type: str
    payload: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    delay: Duration | None = None
    run_at: float | None = None
    priority: int = 0


class App:
    """A replayq application: a database plus the job types declared on it.

    ``url`` defaults to ``$REPLAYQ_DB``, then ``sqlite:///replayq.db``. On SQLite
    the schema is upgraded on open unless ``auto_migrate=False``; on PostgreSQL
    it must be upgraded explicitly (``replayq db upgrade``).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        auto_migrate: bool | None = None,
        rng: random.Random | None = None,
        cache_url: str | None = None,
        blob_limit_bytes: int = DEFAULT_BLOB_LIMIT_BYTES,
    ) -> None:
        self.url = url or os.environ.get("REPLAYQ_DB") or DEFAULT_URL
        self.cache_url = cache_url or os.environ.get("REPLAYQ_CACHE")
        self.blob_limit_bytes = blob_limit_bytes
        self._cache_backend: CacheBackend | None = None
        self.clock: Clock = clock or SystemClock()
        self.hlc = HybridLogicalClock(self.clock)
        self.rng = rng or random.Random()
        self._storage: Storage | None = None
        self._auto_migrate = auto_migrate
        self._handlers: dict[str, dict[str, Handler]] = {}
        self._active: dict[str, str] = {}
        self.compensators: dict[str, Callable[[str, Any], Any]] = {}

    # -- storage ----------------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        """The backend, opened (and on SQLite migrated) on first use."""
        if self._storage is None:
            storage = open_storage(self.url)
            auto = self._auto_migrate
            if auto is None:
                auto = storage.dialect == "sqlite"
            if auto:
                storage.migrate(self.clock.now())
            else:
                todo = pending(storage.migration_status())
                if todo:
                    raise SchemaError(
                        f"the schema of {storage.dialect} database is behind (pending migrations "
                        f"{todo}); run: replayq --db URL db upgrade"
                    )
            self._storage = storage
        return self._storage

    @property
    def state(self) -> StateStore:
        """Versioned entity state, readable from outside a job (production branch)."""
        return StateStore(self)

    @property
    def cache_backend(self) -> CacheBackend:
        """Where ``ctx.cache`` keeps entries: the database, or Redis with ``cache_url``."""
        if self._cache_backend is None:
            self._cache_backend = open_cache(self, self.cache_url)
        return self._cache_backend

    def close(self) -> None:
        """Close every connection this app opened."""
        if self._storage is not None:
            self._storage.close()
            self._storage = None

    # -- declaring job types ----------------------------------------------------------------

    def job(
        self,
        name: str,
        *,
        version: str = "v1",
        candidate: bool = False,
        queue: str = "default",
        lease: Duration = "30s",
        heartbeat: Duration | None = None,
        retry: Retry | None = None,
        idempotency: str | None = None,
        ordering: str | None = None,
        lock: str | None = None,
        lock_ttl: Duration | None = None,
        max_payload_bytes: int = 256 * 1024,
        effects: Iterable[str] | Mapping[str, str] = (),
        cache_namespace: str | None = None,
        cache_ttl: Duration | None = None,
        errors: Mapping[type[BaseException], str] | None = None,
    ) -> Callable[[F], F]:
        """Declare a job type with its contract; the contract is validated here.

        The newest declaration of a type becomes the version workers run, unless
        it is declared ``candidate=True`` (kept for replay, fork and verification).
        """

        def decorate(fn: F) -> F:
            shape = PayloadShape.from_function(fn)
            if not list(inspect.signature(fn).parameters):
                raise ContractError(f"{name}: a handler takes ctx as its first parameter")
            contract = build_contract(
                name,
                fields=shape.fields,
                version=version,
                queue=queue,
                lease=lease,
                heartbeat=heartbeat,
                retry=retry,
                idempotency=idempotency,
                ordering=ordering,
                lock=lock,
                lock_ttl=lock_ttl,
                max_payload_bytes=max_payload_bytes,
                effects=effects,
                cache_namespace=cache_namespace,
                cache_ttl=cache_ttl,
                errors=errors,
            )
            versions = self._handlers.setdefault(name, {})
            if version in versions:
                raise ContractError(f"{name} {version} is declared twice")
            error_map = {exc: FailureClass(cls) for exc, cls in (errors or {}).items()}
            versions[version] = Handler(contract, fn, shape, error_map)
            if not candidate or name not in self._active:
                self._active[name] = version
            return fn

        return decorate

    def compensator(self, kind: str) -> Callable[[F], F]:
        """Register ``fn(key, result)`` that undoes an effect of ``kind`` in the real world.

        Compensation is never automatic: ``replayq rollback JOB --compensate`` runs it.
        """

        def decorate(fn: F) -> F:
            self.compensators[kind] = fn
            return fn

        return decorate

    def adopt_handlers(self, other: App) -> None:
        """Declare every job type of ``other`` here too (replaying a case in a scratch database)."""
        for job_type, versions in other._handlers.items():
            self._handlers[job_type] = dict(versions)
        self._active.update(other._active)
        self.compensators.update(other.compensators)

    def handler(self, job_type: str, version: str | None = None) -> Handler:
        """The handler for a type (the active version unless one is named)."""
        versions = self._handlers.get(job_type)
        if not versions:
            raise UnknownJobTypeError(f"no handler is registered for job type {job_type!r}")
        chosen = version or self._active[job_type]
        if chosen not in versions:
            raise UnknownJobTypeError(
                f"{job_type} has no version {chosen!r} (declared: {', '.join(versions)})"
            )
        return versions[chosen]

    def job_types(self) -> list[str]:
        return sorted(self._handlers)

    def handlers(self) -> list[Handler]:
        """Every declared handler, all versions."""
        return [h for versions in self._handlers.values() for h in versions.values()]

    def active_version(self, job_type: str) -> str | None:
        return self._active.get(job_type)

    def register_contracts(self) -> None:
        """Store every declared contract; a changed contract needs a new version."""
        now = self.clock.now()
        with self.storage.transaction() as tx:
            for handler in self.handlers():
                contract = handler.contract
                body = codec.dumps(contract.to_dict())
                stored = tx.contract_get(contract.name, contract.version)
                if stored is not None and stored != body:
                    raise ContractError(
                        f"the contract of {contract.name} {contract.version} differs from the one "
                        "stored; contracts are frozen per version: declare a new version "
                        f"(see: replayq contract diff {contract.name})"
                    )
                if stored is None:
                    tx.contract_put(contract.name, contract.version, body, now)

    def contracts(self, job_type: str | None = None) -> list[JobContract]:
        """Contracts stored in the database (every version that a worker registered)."""
        with self.storage.transaction() as tx:
            rows = tx.contract_list(job_type)
        return [JobContract.from_dict(codec.loads(body)) for _, _, body, _ in rows]

    # -- enqueue ----------------------------------------------------------------------------

    def insert_job(
        self,
        tx: Transaction,
        request: EnqueueRequest,
        *,
        queue: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        origin: str = "production",
        check: bool = True,
    ) -> int:
        """Insert one job inside ``tx`` (with its ``job.enqueued`` event); returns its id."""
        now = self.clock.now()
        if request.run_at is not None and request.delay is not None:
            raise ConfigurationError("give either delay or run_at, not both")
        run_at = request.run_at if request.run_at is not None else now
        if request.delay is not None:
            run_at = now + parse_duration(request.delay, name="delay")
        versions = self._handlers.get(request.job_type)
        handler = self.handler(request.job_type) if versions else None
        if handler is None and check:
            raise UnknownJobTypeError(
                f"no handler is registered for job type {request.job_type!r}; "
                f"declared: {', '.join(self.job_types()) or 'none'}"
            )
        if handler is not None:
            payload_json = handler.encode_payload(request.payload)
            contract = handler.contract
            max_attempts = contract.retry.max_attempts
            ordering_key = render_template(contract.ordering, request.payload)
            idempotency_key = render_template(contract.idempotency, request.payload)
            job_queue = queue or contract.queue
        else:
            if not isinstance(request.payload, dict):
                raise PayloadError("payload must be a JSON object")
            payload_json = codec.dumps(request.payload, what=f"{request.job_type} payload")
            if len(payload_json.encode()) > UNCHECKED_MAX_PAYLOAD_BYTES:
                raise PayloadError(
                    f"payload is above the {UNCHECKED_MAX_PAYLOAD_BYTES} bytes allowed "
                    "for job types this app does not declare"
                )
            max_attempts, ordering_key, idempotency_key = Retry().max_attempts, None, None
            job_queue = queue or "default"
        hlc = self.hlc.tick()
        params = JobInsert(
            job_type=request.job_type,
            queue=job_queue,
            payload_json=payload_json,
            priority=request.priority,
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
        )
        job_id, created = tx.job_insert(params)
        job = tx.job_get(job_id)
        assert job is not None
        if created:
            event = trace.lifecycle(
                trace.JOB_ENQUEUED,
                job,
                now=now,
                hlc=hlc,
                status="queued",
                attempt=0,
                message_id=request.message_id,
                priority=request.priority,
                run_at=run_at,
                ordering_key=ordering_key,
                causation_id=causation_id,
            )
        else:
            event = trace.lifecycle(
                trace.JOB_DEDUPLICATED,
                job,
                now=now,
                hlc=hlc,
                message_id=request.message_id,
                rule="same message_id yields the existing job",
            )
        tx.trace_append([event])
        return job_id

    def enqueue(
        self,
        job_type: str,
        payload: dict[str, Any] | None = None,
        *,
        message_id: str | None = None,
        delay: Duration | None = None,
        run_at: float | None = None,
        priority: int = 0,
        queue: str | None = None,
        conn: Any = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        check: bool = True,
    ) -> int:
        """Enqueue one job and return its id.

        The payload is checked against the handler's signature and contract
        (``PayloadError`` names the field or limit). The same ``message_id``
        returns the existing job. With ``conn`` (a connection of the caller's,
        inside an open transaction on the same database), the job exists only
        if the caller commits. ``check=False`` enqueues a type this app does not
        declare (the worker that runs it validates it).
        """
        request = EnqueueRequest(job_type, payload or {}, message_id, delay, run_at, priority)
        kwargs: dict[str, Any] = {
            "queue": queue,
            "correlation_id": correlation_id,
            "causation_id": causation_id,
            "check": check,
        }
        if conn is not None:
            return self.insert_job(self.storage.adopt(conn), request, **kwargs)
        with self.storage.transaction() as tx:
            return self.insert_job(tx, request, **kwargs)

    def enqueue_many(self, requests: Sequence[EnqueueRequest], *, conn: Any = None) -> list[int]:
        """Enqueue many jobs in one transaction; all or none."""
        if conn is not None:
            tx = self.storage.adopt(conn)
            return [self.insert_job(tx, r) for r in requests]
        with self.storage.transaction() as tx:
            return [self.insert_job(tx, r) for r in requests]

    # -- inspecting -------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        with self.storage.transaction(readonly=True) as tx:
            job = tx.job_get(job_id)
        if job is None:
            raise ReplayqError(f"no job with id {job_id}")
        return job

    def list_jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        job_type: str | None = None,
        origin: str | None = "production",
        limit: int = 100,
    ) -> list[Job]:
        with self.storage.transaction(readonly=True) as tx:
            return tx.job_list(JobFilter(states, job_type, origin, limit))

    def trace(self, job_id: int) -> list[TraceEvent]:
        """Every event of a job, ordered by the hybrid logical clock."""
        with self.storage.transaction(readonly=True) as tx:
            return tx.trace_for_job(job_id)

    def resource_trace(self, resource: str, *, leases: bool = False) -> list[TraceEvent]:
        """Every event touching one resource, across jobs and workers, in HLC order.

        With ``leases`` the lease transitions of the jobs that touched the
        resource are merged in (leased, lease expired, re-delivered, settled,
        write rejected): which worker held which job between its reads and
        writes of the resource.
        """
        with self.storage.transaction(readonly=True) as tx:
            events = tx.trace_for_resource(resource)
            if leases:
                for job_id in sorted({e.job_id for e in events if e.job_id is not None}):
                    events.extend(
                        e
                        for e in tx.trace_for_job(job_id)
                        if e.kind == "lifecycle" and e.name in RESOURCE_LIFECYCLE
                    )
        return sorted(events, key=lambda e: (e.hlc, e.id or 0))

    def cancel(self, job_id: int) -> bool:
        """Cancel a queued job; ``False`` if it is no longer queued."""
        now, hlc = self.clock.now(), self.hlc.tick()
        with self.storage.transaction() as tx:
            if not tx.job_cancel(job_id, now, hlc):
                return False
            job = tx.job_get(job_id)
            assert job is not None
            tx.trace_append(
                [trace.lifecycle(trace.JOB_CANCELLED, job, now=now, hlc=hlc, status="cancelled")]
            )
        return True

    def requeue(self, job_id: int, *, reason: str) -> bool:
        """Move a dead job back to the queue with one more attempt; the reason is traced."""
        if not reason.strip():
            raise ConfigurationError("requeue needs a reason; it goes into the job's trace")
        now, hlc = self.clock.now(), self.hlc.tick()
        with self.storage.transaction() as tx:
            if not tx.job_requeue(job_id, now, hlc):
                return False
            job = tx.job_get(job_id)
            assert job is not None
            tx.trace_append(
                [trace.lifecycle(trace.JOB_REQUEUED, job, now=now, hlc=hlc, reason=reason)]
            )
        return True
