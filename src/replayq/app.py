"""The facade: declare job types with their contracts, enqueue, inspect, run workers."""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from msgspec import structs

from replayq.clock import Clock, HybridLogicalClock, SystemClock
from replayq.durations import Duration
from replayq.errors import ConfigurationError, ContractError, FailureClass, ReplayqError
from replayq.observe.otel import enqueue_span
from replayq.queue.catalog import register_contracts, stored_contracts
from replayq.queue.contracts import (
    DEFAULT_RESUME,
    JobContract,
    LintFinding,
    Retry,
    build_contract,
    lint_contract,
    unchecked_rules,
)
from replayq.queue.enqueue import EnqueueRequest, enqueue_job, get_job, insert_job, insert_jobs
from replayq.queue.handlers import Handler, HandlerRegistry, PayloadShape
from replayq.queue.inspection import JobsFacade
from replayq.queue.periodic import periodic_decorator
from replayq.queue.retention import GC_JOB, GcReport, Retention, RetentionPolicy, run_gc
from replayq.queue.schedule import DEFAULT_CATCH_UP, Schedule
from replayq.queue.scheduler import ScheduleStatus, schedule_statuses
from replayq.recording.effects_facade import EffectsFacade
from replayq.recording.state import StateStore
from replayq.redaction import Redaction, Redactor
from replayq.rollout.verify_job import verify_handler
from replayq.runtime import DEFAULT_BLOB_LIMIT_BYTES, Limits, Runtime
from replayq.storage import open_storage
from replayq.storage.adopted import AsyncConnectionView, run_bridged
from replayq.storage.cache import CacheBackend
from replayq.storage.params import ActiveVersion, JobFilter
from replayq.storage.protocol import (
    JobHour,
    KeepRecord,
    MigrationStatus,
    Storage,
    Transaction,
)
from replayq.storage.reports import JobDurations
from replayq.storage.retention_params import JobHours, KeepPin, KeptJobs

if TYPE_CHECKING:
    from replayq.rollout.control import Rollout

__all__ = ["App", "EnqueueRequest"]

F = TypeVar("F", bound=Callable[..., Any])


DEFAULT_URL = "sqlite:///replayq.db"
# How many of a type's newest production jobs ``lint`` reads lock holds from.
LOCK_WINDOW = 1000


class App(JobsFacade, EffectsFacade):
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
        redaction: Redaction | None = None,
        retention: Retention | None = None,
        retention_by_type: Mapping[str, Retention] | None = None,
    ) -> None:
        self.url = url or os.environ.get("REPLAYQ_DB") or DEFAULT_URL
        self.cache_url = cache_url or os.environ.get("REPLAYQ_CACHE")
        self.clock: Clock = clock or SystemClock()
        self.redaction = redaction
        self.runtime = Runtime(
            url=self.url,
            clock=self.clock,
            hlc=HybridLogicalClock(self.clock),
            rng=rng or random.Random(),
            registry=HandlerRegistry(),
            limits=Limits(blob_limit_bytes=blob_limit_bytes),
            cache_url=self.cache_url,
            auto_migrate=auto_migrate,
            redactor=Redactor.build(redaction),
        )
        self.hlc = self.runtime.hlc
        self.retention = RetentionPolicy(retention or Retention(), dict(retention_by_type or {}))
        self.rng = self.runtime.rng
        self.registry = self.runtime.registry
        # replayq's own job types (background verification), run by any worker of this app.
        self.registry.declare_system(verify_handler())
        self.compensators = self.registry.compensators
        self.schedules: list[Schedule] = self.registry.schedules

    # -- storage ----------------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        """The backend, opened (and on SQLite migrated) on first use."""
        return self.runtime.storage

    @property
    def state(self) -> StateStore:
        """Versioned entity state, readable from outside a job (production branch)."""
        return StateStore(self.runtime)

    @property
    def cache_backend(self) -> CacheBackend:
        """Where ``ctx.cache`` keeps entries: the database, or Redis with ``cache_url``."""
        return self.runtime.cache_backend

    def schema_upgrade(self) -> list[MigrationStatus]:
        """Apply pending migrations (without opening the app's own storage); returns them."""
        storage = open_storage(self.url)
        try:
            return storage.migrate(self.clock.now())
        finally:
            storage.close()

    def schema_status(self) -> list[MigrationStatus]:
        """Every migration and whether it is applied."""
        storage = open_storage(self.url)
        try:
            return storage.migration_status()
        finally:
            storage.close()

    def close(self) -> None:
        """Close every connection this app opened."""
        self.runtime.close()

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
        resume: str = DEFAULT_RESUME,
        redact: Redaction | None = None,
        retention: Retention | Mapping[str, float | None] | None = None,
    ) -> Callable[[F], F]:
        """Declare a job type with its contract; the contract is validated here.

        The newest declaration of a type becomes the version workers run, unless
        it is declared ``candidate=True`` (kept for replay, fork and verification).
        ``resume="step"`` (the default): a retry returns the recorded result of each
        ``ctx.step(name, fn)`` an earlier attempt committed instead of running it again;
        ``"none"``: every attempt runs every step.
        ``redact``: field names and patterns secret in this job type, on top of the app's
        ``redaction`` (see ``replayq.redaction``).
        ``retention``: this type's retention in its contract, over the app's: a
        ``Retention`` sets every field (None: forever), a mapping only the fields it names
        (``{"full_days": 7}``); ``replayq contract diff`` and ``check`` show a change.
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
                resume=resume,
                payload_schema=shape.schema(),
                retention=retention,
            )
            error_map = {exc: FailureClass(cls) for exc, cls in (errors or {}).items()}
            redactor = self.runtime.redactor.extended(redact) if redact else None
            handler = Handler(contract, fn, shape, error_map, redactor)
            self.registry.declare(handler, candidate=candidate)
            return fn

        return decorate

    def periodic(
        self,
        cron: str,
        *,
        job: str | None = None,
        payload: Mapping[str, Any] | None = None,
        name: str | None = None,
        timezone: str = "UTC",
        missed: str = "skip",
        catch_up: int = DEFAULT_CATCH_UP,
        grace: Duration | None = None,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[F], F]:
        """Enqueue a job on a cron schedule (``croniter`` syntax; a sixth field is seconds).

        Use it above ``@app.job(...)`` (the job type is the decorated handler's), or call
        it with ``job="type"`` on its own. Every worker runs the scheduler unless started
        with ``--no-scheduler``; each slot is enqueued once however many run, as a job
        with the message id ``schedule:NAME:SLOT``. ``missed`` says what happens to slots
        that passed while no scheduler ran: ``skip``, ``run_once`` or ``run_all`` (the
        newest ``catch_up`` of them). A slot counts as on time for ``min(grace, period)``
        (``grace`` defaults to 60 seconds). ``name`` defaults to the job type.
        """
        return periodic_decorator(
            self.registry,
            cron,
            job=job,
            payload=payload,
            name=name,
            timezone=timezone,
            missed=missed,
            catch_up=catch_up,
            grace=grace,
            queue=queue,
            priority=priority,
        )

    def schedule_statuses(self) -> list[ScheduleStatus]:
        """Each schedule: its cron, the last slot it enqueued and that job, the next slot."""
        return schedule_statuses(self.runtime, self.schedules)

    def compensator(self, kind: str) -> Callable[[F], F]:
        """Register ``fn(key, result)`` that undoes an effect of ``kind`` in the real world.

        Compensation is never automatic: ``replayq rollback JOB --compensate`` runs it.
        """

        def decorate(fn: F) -> F:
            self.compensators[kind] = fn
            return fn

        return decorate

    def reconciler(self, kind: str) -> Callable[[F], F]:
        """Register ``fn(record) -> EffectResolution | None`` that asks the provider the truth.

        Called for an in-doubt effect of ``kind`` (``record`` is an ``EffectRecord``)
        by the worker before it parks the job, and by ``replayq effects resolve
        --auto``. Return ``None`` when the provider does not know; an exception
        counts as unknown too.
        """

        def decorate(fn: F) -> F:
            self.registry.reconcilers[kind] = fn
            return fn

        return decorate

    def on_database(self, url: str) -> App:
        """The same job types, clock and options on another database (``--db`` with ``--app``)."""
        runtime = self.runtime
        other = App(
            url,
            clock=self.clock,
            auto_migrate=runtime.auto_migrate,
            rng=runtime.rng,
            cache_url=self.cache_url,
            blob_limit_bytes=runtime.limits.blob_limit_bytes,
            redaction=self.redaction,
        )
        other.adopt_handlers(self)
        other.schedules.extend(self.schedules)
        other.retention = self.retention
        return other

    def gc(
        self,
        *,
        dry_run: bool = False,
        batch: int = 500,
        pause: float = 0.0,
        max_batches: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> GcReport:
        """Apply the retention tiers to finished jobs (``replayq gc``; queue/retention.py)."""
        return run_gc(
            self.storage,
            self.clock,
            self.retention_policy(),
            dry_run=dry_run,
            batch=batch,
            pause=pause,
            max_batches=max_batches,
            progress=progress,
        )

    def gc_periodic(
        self, cron: str = "17 * * * *", *, batch: int = 500, pause: float = 0.05
    ) -> None:
        """Run gc as a built-in periodic job (type ``replayq.gc``, hourly by default): the
        worker's scheduler enqueues it, any worker runs it; its result is the report."""

        def collect(ctx: Any) -> dict[str, Any]:
            report = self.gc(batch=batch, pause=pause)
            if report.partitions_kept:
                # Retention not kept for those days: the job goes dead (max_attempts=1),
                # where an operator looks, as ``replayq gc`` exits 1.
                raise ConfigurationError(
                    "gc kept expired ledger days that objects of the database's owner "
                    f"depend on (drop or move them): {'; '.join(report.partitions_kept)}"
                )
            return dataclasses.asdict(report)

        handler = self.job(GC_JOB, lease="10m", retry=Retry(max_attempts=1))(collect)
        self.periodic(cron, missed="run_once")(handler)

    def retention_policy(self) -> RetentionPolicy:
        """The retention gc applies: the app's (``retention``, ``retention_by_type``) with
        each declared contract's ``retention`` fields over it."""
        contracts: dict[tuple[str, str | None], dict[str, float | None]] = {}
        for handler in self.registry.handlers():
            contract = handler.contract
            # Every declared version, an empty mapping when its contract sets none.
            contracts[(contract.name, contract.version)] = dict(contract.retention or {})
        for job_type in self.registry.job_types():
            active = self.registry.active_version(job_type)
            if (job_type, active) in contracts:
                contracts[(job_type, None)] = contracts[(job_type, active)]
        return structs.replace(self.retention, contracts=contracts)

    def keep(self, job_id: int, reason: str) -> None:
        """Pin a job so gc never collects it (``replayq keep JOB --reason``)."""
        get_job(self.runtime, job_id)
        with self.storage.transaction() as tx:
            if not tx.keep_transition(KeepPin(job_id, reason, self.clock.now())):
                raise ReplayqError(f"no job with id {job_id} (gc deleted it meanwhile)")

    def job_hours(self, job_type: str | None = None) -> list[JobHour]:
        """The aggregates tier: the jobs gc deleted, counted per type, version, hour, state."""
        with self.storage.transaction(readonly=True) as tx:
            return tx.gc_scan(JobHours(job_type))

    def kept(self) -> list[KeepRecord]:
        with self.storage.transaction(readonly=True) as tx:
            return tx.gc_scan(KeptJobs())

    def adopt_handlers(self, other: App) -> None:
        """Declare every job type of ``other`` here too (replaying a case in a scratch database)."""
        self.registry.adopt(other.registry)

    def handler(self, job_type: str, version: str | None = None) -> Handler:
        """The handler for a type (the active version unless one is named)."""
        return self.registry.handler(job_type, version)

    def job_types(self) -> list[str]:
        return self.registry.job_types()

    def handlers(self) -> list[Handler]:
        """Every declared handler, all versions."""
        return self.registry.handlers()

    def active_version(self, job_type: str) -> str | None:
        return self.registry.active_version(job_type)

    def register_contracts(self) -> None:
        """Store every declared contract; a changed contract needs a new version."""
        register_contracts(self.runtime)

    def contracts(self, job_type: str | None = None) -> list[JobContract]:
        """Contracts stored in the database (every version that a worker registered)."""
        return stored_contracts(self.runtime, job_type)

    def lint(self, job_type: str | None = None, *, unchecked: bool = False) -> list[LintFinding]:
        """Lint every stored contract against the rules and what its jobs were seen doing:
        the p99 run time against the lease, each lock hold against the TTL it used.

        A behaviour rule with nothing recorded to check against (a version never run in
        production, a candidate) is silent here: pass ``unchecked=True`` to also get one
        ``kind="unchecked"`` entry per such rule, with the reason (docs/contracts.md)."""
        from replayq.recording.locks import observed_holds

        findings = []
        for item in self.contracts(job_type):
            attempts_read = None
            with self.storage.transaction(readonly=True) as tx:
                durations = sorted(tx.report(JobDurations(item.name, item.version)))
                active = tx.rollout_query(ActiveVersion(item.name)) if unchecked else None
                if unchecked and durations:
                    # The window observed_holds reads: a backlog of queued jobs, or a
                    # newer version's, can leave none of this version's runs in it.
                    window = tx.job_list(JobFilter(None, item.name, "production", LOCK_WINDOW))
                    attempts_read = sum(
                        1 for j in window if j.handler_version == item.version and j.attempt > 0
                    )
            p99 = (
                durations[min(len(durations) - 1, int(len(durations) * 0.99))]
                if durations
                else None
            )
            holds = observed_holds(self.runtime, item.name, item.version, jobs=LOCK_WINDOW)
            findings.extend(lint_contract(item, p99_duration=p99, lock_holds=holds))
            if unchecked:
                findings.extend(
                    unchecked_rules(
                        item,
                        attempts=len(durations),
                        lock_holds=holds,
                        active_version=active,
                        attempts_read=attempts_read,
                        window=LOCK_WINDOW,
                    )
                )
        return findings

    # -- enqueue ----------------------------------------------------------------------------

    def insert_job(
        self,
        tx: Transaction,
        request: EnqueueRequest,
        **options: Any,
    ) -> int:
        """Insert one job inside ``tx`` (with its ``job.enqueued`` event); returns its id."""
        return insert_job(self.runtime, tx, request, **options)

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any] | Any = None,
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
        require_contract: bool = False,
    ) -> int:
        """Enqueue one job and return its id.

        The payload is checked against the handler's signature and contract
        (``PayloadError`` names the field or limit): a JSON object whose typed fields
        may hold ``Decimal``, aware ``datetime``, ``UUID``, enums, dataclasses..., or the
        dataclass / pydantic model the handler declares as its whole payload. The same
        ``message_id`` returns the existing job. With ``conn`` — the caller's own DB-API
        connection to the same database (``sqlite3``, psycopg with any row
        factory, a framework's), inside its open transaction — the job exists
        only if the caller commits; ``replayq.contrib`` finds that connection for
        Django and SQLAlchemy. ``check=False`` enqueues a type this app does not
        declare (the worker that runs it validates it).
        """
        request = EnqueueRequest(job_type, payload or {}, message_id, delay, run_at, priority)
        # With OpenTelemetry configured, the job row carries this producer span's context.
        with enqueue_span(job_type) as trace_context:
            kwargs: dict[str, Any] = {
                "queue": queue,
                "correlation_id": correlation_id,
                "causation_id": causation_id,
                "check": check,
                "require_contract": require_contract,
                "trace_context": trace_context,
            }
            if conn is not None:
                return self.insert_job(self.storage.adopt(conn), request, **kwargs)
            return enqueue_job(self.runtime, request, **kwargs)

    async def enqueue_async(
        self,
        job_type: str,
        payload: Mapping[str, Any] | Any = None,
        *,
        conn: Any,
        message_id: str | None = None,
        delay: Duration | None = None,
        run_at: float | None = None,
        priority: int = 0,
        queue: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        check: bool = True,
    ) -> int:
        """``enqueue`` on the caller's async connection (``psycopg.AsyncConnection``).

        The job is inserted inside the caller's open transaction on this event loop
        and exists only if the caller commits. Checks and options are ``enqueue``'s.
        The app's own storage is opened (blocking, once) if it was not yet.
        """
        request = EnqueueRequest(job_type, payload or {}, message_id, delay, run_at, priority)
        storage = self.storage
        # As ``enqueue``: the job row carries the producer span's context (it had none).
        with enqueue_span(job_type) as trace_context:
            return await run_bridged(
                lambda: self.insert_job(
                    storage.adopt(AsyncConnectionView(conn)),
                    request,
                    queue=queue,
                    correlation_id=correlation_id,
                    causation_id=causation_id,
                    check=check,
                    trace_context=trace_context,
                )
            )

    def enqueue_many(self, requests: Sequence[EnqueueRequest], *, conn: Any = None) -> list[int]:
        """Enqueue many jobs in one transaction; all or none.

        Set-based: every row in one insert (one statement on PostgreSQL), every
        ``job.enqueued`` event in one trace append; ids in the requests' order.
        """
        if conn is not None:
            return insert_jobs(self.runtime, self.storage.adopt(conn), requests)
        with self.storage.transaction() as tx:
            return insert_jobs(self.runtime, tx, requests)

    # -- rollouts ---------------------------------------------------------------------------

    def rollout(self, job_type: str, *, actor: str | None = None) -> Rollout:
        """The routing of ``job_type``: read it, and change it (each change recorded)."""
        # Imported here: a worker never changes routing, and the gates came with it.
        from replayq.rollout.control import Rollout

        return Rollout(self, job_type, actor=actor)
