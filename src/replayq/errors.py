"""Every error replayq raises, and how a handler's failure maps to retry behaviour.

The tree::

    ReplayqError
    ├── ConfigurationError          a contract, URL or option that cannot work
    │   └── ContractError           a job contract rejected when declared
    ├── PayloadError                bad input at enqueue (not JSON, missing field, too large)
    ├── UnknownJobTypeError         enqueue or lease of a type no handler is registered for
    ├── StorageError                the database failed; the driver error is ``__cause__``
    │   ├── DatabaseUnavailableError   the database cannot be opened or reached
    │   │   └── StatementCancelledError  the server cancelled a statement (PostgreSQL 57014)
    │   ├── StorageClosedError      a storage used after its ``close()`` (never again usable)
    │   ├── SchemaError             the schema is missing or newer than this code
    │   ├── ConstraintViolationError  a write refused by a constraint (unique, foreign key,
    │   │                           check, not null): refused again if tried again
    │   └── LeaseCollisionError     a claim collided on an ordering key and aborted its
    │                               transaction (asked for: ``JobLease.collision_aborts``)
    ├── LeaseLostError              a write by a worker whose lease on the job is gone
    │                               (refused in the database: ``write.fenced``), or a
    │                               handler's cancel point once the heartbeat found it gone
    ├── JobCancelledError           raised in a handler at its next step boundary or ctx
    │                               call once the running job was asked to stop
    ├── ContextEndedError           a ``ctx`` used after its handler returned (kept by a
    │                               thread or a closure past the return)
    ├── ReplayDivergenceError       a replay asked for something the recording does not have
    ├── RecordedFailure             in a replay, a call or effect that failed in the recording
    │                               (also a JobError of its recorded class: see recorded_failure)
    ├── EffectRefusedError          a rerun met an effect kind it may not run, with no recording
    ├── RollbackRefusedError        a later job wrote what a rollback would restore
    ├── RolloutRefusedError         a routing change refused: a gate says the candidate is
    │                               worse, a version not declared, a concurrent change
    ├── UnrecordedIOError           in a sealed replay, handler I/O that bypassed ``ctx``
    │                               (also a ``PermissionError``: see the class)
    └── JobError                    raised *by handlers*; its class decides retries
        ├── TransientError          class ``transient``   — retried by default
        ├── DependencyError         class ``dependency``  — retried by default
        ├── ConcurrencyError        class ``concurrency`` — retried by default
        │   ├── StaleFencingTokenError  a write under a lock that has since been re-acquired
        │   └── LockTimeoutError        a lock held by someone else past the wait
        ├── ValidationError         class ``validation``  — never retried
        │   ├── StepLeftOpenError   raised by replayq: the handler returned with a step of
        │   │                       its own left open, or one its generator's close ended
        │   │                       dropping writes (a bug of the handler's code)
        │   └── CallbackReentryError  raised by replayq: ``ctx`` used inside a function
        │                           replayq runs in its own commit (``ctx.db_write``'s)
        └── EffectInDoubtError      class ``in_doubt`` — an effect's outcome is unknown and
                                    its kind's policy is ``park``: a human (or the kind's
                                    reconciler) settles it, then the job is requeued

Any other exception a handler raises is class ``unknown`` unless the job
contract maps it (``errors={TimeoutError: "transient"}``); ``TimeoutError``
and ``ConnectionError`` map to ``transient`` out of the box, and
``DatabaseUnavailableError`` (replayq's own database unreachable) to ``dependency``,
``ConstraintViolationError`` (a write of the handler's refused by a constraint of the
database, at a step's commit or at the ack) to ``validation``. ``StepLeftOpenError``, which
replayq raises for a handler that returned with a step left open, is ``validation``
whatever the contract maps (a ``JobError``'s own class comes first): the same code leaves
it open again, so it is never retried. A constraint of replayq's
own tables (``rq_*``: ``ConstraintViolationError.internal``) refusing replayq's own write
is no class of the job's: a bug of replayq, the job parked in ``dead`` with reason
``internal_error`` (class ``unknown``), never retried, whatever the contract maps.

Failure classes and what the worker does with them (``RETRY_TABLE``):

=============  =====================================================
class          behaviour
=============  =====================================================
transient      retried if listed in ``Retry.on`` (default: yes)
dependency     retried if listed in ``Retry.on`` (default: yes)
concurrency    retried if listed in ``Retry.on`` (default: yes)
validation     never retried: straight to ``dead``
in_doubt       never retried: ``dead`` (``effect_in_doubt``) until the effect is settled
unknown        retried only if listed in ``Retry.on`` (default: no)
=============  =====================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any


class FailureClass(StrEnum):
    """Why a job attempt failed, as stored in the trace and used for retry decisions."""

    TRANSIENT = "transient"
    DEPENDENCY = "dependency"
    CONCURRENCY = "concurrency"
    VALIDATION = "validation"
    IN_DOUBT = "in_doubt"
    UNKNOWN = "unknown"


RETRY_TABLE: dict[FailureClass, str] = {
    FailureClass.TRANSIENT: "retried if listed in Retry.on (default: yes)",
    FailureClass.DEPENDENCY: "retried if listed in Retry.on (default: yes)",
    FailureClass.CONCURRENCY: "retried if listed in Retry.on (default: yes)",
    FailureClass.VALIDATION: "never retried",
    FailureClass.IN_DOUBT: "never retried: dead until the effect is settled (replayq effects)",
    FailureClass.UNKNOWN: "retried only if listed in Retry.on (default: no)",
}


class ReplayqError(Exception):
    """Root of every exception replayq raises."""


class ConfigurationError(ReplayqError):
    """A contract, URL or option that cannot work as given."""


class ContractError(ConfigurationError):
    """A job contract that was rejected when it was declared."""


class PayloadError(ReplayqError):
    """A payload rejected at enqueue; the message names the field or the limit."""

    # (field path, value) when the message quotes the field's value: redacted before the
    # message leaves the enqueue (``payload_types.without_secrets``).
    quoted: tuple[str, Any] | None = None


class UnknownJobTypeError(ReplayqError):
    """No handler is registered for this job type."""


class StorageError(ReplayqError):
    """The database failed; the driver's exception is kept as ``__cause__``."""


class DatabaseUnavailableError(StorageError):
    """The database file or server cannot be opened or reached."""


# The same class under the name an operator may look for: "storage unavailable" (exit 3).
StorageUnavailableError = DatabaseUnavailableError


class StorageClosedError(StorageError):
    """A storage used after its ``close()``: that storage object never serves again, so
    this is no ``DatabaseUnavailableError`` to wait out. An ``App`` opens a new storage at
    its next use, though: a worker whose app was closed under it (``App.close()`` while it
    runs) takes what met this for a storage fault, and goes on with the new one."""


class SchemaError(StorageError):
    """The schema is missing, newer than this version of replayq understands, or cannot be
    upgraded without dropping an object of the database's owner."""


class ConstraintViolationError(StorageError):
    """The database refused a write by a constraint: a unique key, a foreign key, a check,
    a not-null column (PostgreSQL SQLSTATE class 23; SQLite ``SQLITE_CONSTRAINT``,
    ``sqlite3.IntegrityError``). Nothing of the transaction was written, and the same
    write is refused again: not an outage to wait out.

    The message names the constraint (and, on PostgreSQL, its table), never the refused
    row's values. In a worker it is the attempt's failure, class ``validation`` unless
    the contract maps it (``errors={ConstraintViolationError: "concurrency"}``): a
    handler's ``ctx.db_write`` refused at a step's commit or at its ack fails its job,
    which goes to ``dead`` with this message instead of being retried without end.

    ``table`` is the refusing constraint's table where the database names it (PostgreSQL's
    diagnostics; SQLite's message for a unique key or a not-null column, and for a
    ``CHECK`` of replayq's own schema), and ``constraint`` the constraint (PostgreSQL: its
    name; SQLite: what its message names). ``internal``: the table is one of replayq's
    own (``rq_*``): its own write refused by its own schema is a bug of replayq, not the
    job's data failing a check; a worker parks that job in ``dead`` with reason
    ``internal_error``, never ``validation`` and never retried."""

    def __init__(
        self, message: str, *, table: str | None = None, constraint: str | None = None
    ) -> None:
        super().__init__(message)
        self.table = table
        self.constraint = constraint

    @property
    def internal(self) -> bool:
        """Whether the refusing constraint's table is one of replayq's own (``rq_*``)."""
        return self.table is not None and self.table.startswith(OWN_TABLE_PREFIX)


# The prefix of the name of every table of replayq's own schema.
OWN_TABLE_PREFIX = "rq_"


class RowLockTimeoutError(DatabaseUnavailableError):
    """A statement waited for a row lock longer than its transaction's ``lock_timeout``
    (PostgreSQL, SQLSTATE 55P03) and was cancelled: its transaction rolled back, its
    connection good. Where nothing asked for that bound (an application's ``NOWAIT``, a
    server-wide ``lock_timeout``) it is waited out as any ``DatabaseUnavailableError``; an
    acquisition of ``ctx.lock``, which bounds its wait for the lock's row by what is left
    of its ``wait``, reads it as "not granted yet"."""


class StatementCancelledError(DatabaseUnavailableError):
    """The server cancelled a statement (PostgreSQL, SQLSTATE 57014: a ``statement_timeout``
    of the role or database, an operator's ``pg_cancel_backend``): its transaction rolled
    back, its connection good. Waited out as any ``DatabaseUnavailableError``, but the
    same statement may be cancelled on every try (a handler's ``ctx.db_write`` slower than
    the timeout): a worker's ack cancelled try after try is put back to the queue, as a
    step's commit the database failed, never waited on without end."""


class LeaseCollisionError(StorageError):
    """A claim collided with another claimer's on an ordering key and aborted the whole
    transaction: nothing in it was written, and the caller does it again.

    Raised only where the caller asked for it (``JobLease.collision_aborts``); otherwise
    the claim is undone alone and tried again inside the transaction."""


class RolloutRefusedError(ReplayqError):
    """A rollout change was refused; the message says which gate, version or race, and why."""


class LeaseLostError(ReplayqError):
    """A worker tried to write a job whose lease it no longer holds, or its handler reached
    a cancel point (``ctx.step``, ``ctx.call``...) after the heartbeat found the lease lost.

    Let it propagate: the job is another worker's now. The attempt is recorded as a refused
    settle (its events, then ``job.write_rejected``), none of its writes commit, and this
    worker schedules no retry. Not a ``JobError``: it is never retried."""


class JobCancelledError(ReplayqError):
    """The running job was asked to stop (``replayq jobs cancel``); raised in the handler at
    its next step boundary or ``ctx`` call. Let it propagate: the attempt ends ``cancelled``
    with the steps it had committed. Not a ``JobError``: it is never retried."""


class ContextEndedError(ReplayqError):
    """A ``Context`` used after its handler returned: a view read (``ctx.state``,
    ``ctx.effects``...) or a method of a view kept in a variable, a verb called
    (``ctx.step``, ``ctx.call``...) or ``ctx.now/random/uuid``, by code that kept ``ctx``
    past the handler's return (a background thread, a closure called later, an awaitable
    awaited later).

    The context ends when the handler returns, before the attempt is settled (a worker's
    ack is handed to its group commit after it): what the late use would record belongs
    to no commit of the attempt, so it is refused rather than dropped or raced. A ``ctx``
    is good for the one call of the handler it was passed to; ``ctx.job`` and
    ``ctx.payload`` stay readable."""


class JobError(ReplayqError):
    """Base for exceptions handlers raise on purpose; ``failure_class`` drives retries."""

    failure_class: FailureClass = FailureClass.UNKNOWN


class TransientError(JobError):
    """A failure that may pass on its own (timeout, brief outage)."""

    failure_class = FailureClass.TRANSIENT


class DependencyError(JobError):
    """A dependency (upstream API, database) is unavailable."""

    failure_class = FailureClass.DEPENDENCY


class ConcurrencyError(JobError):
    """An optimistic write lost a race (``expected_version`` did not match), or an
    effect's key is in flight in another job's attempt that still holds its lease."""

    failure_class = FailureClass.CONCURRENCY


class StaleFencingTokenError(ConcurrencyError):
    """A state write carried a fencing token older than the lock's newest; it was rejected."""


class LockTimeoutError(ConcurrencyError):
    """A lock stayed held by another owner longer than the caller would wait."""


class ValidationError(JobError):
    """The job can never succeed as given; it goes to ``dead`` at once."""

    failure_class = FailureClass.VALIDATION


class StepLeftOpenError(ValidationError):
    """The handler returned with a step of its own flow still open, or with one that its
    generator's close ended while writes waited; ``step`` names it.

    Raised by replayq at the handler's return, not by the handler: a generator (or an
    ``async`` generator) suspended inside ``with ctx.step(...)`` and kept past the return
    leaves its step open, and that step holds the writes of the handler's thread (an
    ``async def`` handler's task), those made after it outside any step too; a generator
    closed while suspended in its step (a ``for`` loop over it left early, ``close()``,
    ``aclose()``) ended the step as failed, dropping them, and the close swallowed the
    exit. The ack would have dropped those writes while the job succeeded: the attempt
    fails instead (the steps it committed before stay committed).

    A bug of the handler's code, which does it again on every attempt: class
    ``validation``, never retried, whatever the contract's ``errors`` maps or ``Retry.on``
    lists (a ``JobError``'s own class is asked first). The job goes to ``dead`` (reason
    ``not_retryable``). Keep ``yield`` out of ``with ctx.step(...)``: put the step around
    the loop that consumes the generator, or run the generator to its end."""

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


class CallbackReentryError(ValidationError):
    """``ctx`` used inside a function that replayq runs in the middle of its own commit: a
    ``ctx.db_write`` function, which runs inside the transaction that commits its step (or
    the job's ack). ``verb`` names the call refused (``ctx.call('price')``), ``callback``
    the function it was made in (``ctx.db_write``).

    Refused at once, before the verb does anything: at a step's commit the context
    records nothing else until that commit ends, so the verb would wait for it forever
    (``ctx.step``, ``ctx.call``, ``ctx.effect``), or its write would land in no commit
    while the trace said it did (``ctx.state.put``, ``ctx.outbox.publish``...); and no
    replay or fork runs the function, so what it recorded could not be replayed. The
    function's own rows roll back with the rest of that commit; a refusal the function
    caught still fails it.

    A bug of the handler's code, the same on every attempt: class ``validation``, never
    retried, whatever the contract maps. Inside the function use only the connection it
    is given; call ``ctx`` before ``ctx.db_write`` (pass the function what it needs) or
    after the step."""

    def __init__(self, message: str, *, verb: str, callback: str) -> None:
        super().__init__(message)
        self.verb = verb
        self.callback = callback


class EffectInDoubtError(JobError):
    """An earlier attempt started this effect and never recorded its outcome.

    Raised when the effect kind's in-doubt policy is ``park``; the job goes to
    ``dead`` (reason ``effect_in_doubt``) so that a human checks the real world,
    settles the record (``replayq effects resolve KEY``) and requeues the job.
    Its own class: retrying cannot help, and the input is not at fault.
    """

    failure_class = FailureClass.IN_DOUBT


class ReplayDivergenceError(ReplayqError):
    """During replay the handler asked for a call or effect the recording does not have."""


class EffectRefusedError(ReplayqError):
    """A rerun met an effect kind it is not allowed to run and has no recorded result for."""


class RollbackRefusedError(ReplayqError):
    """A later job wrote an entity this job wrote; rollback would undo its work too."""


class RecordedFailure(ReplayqError):
    """In a replay, a call or effect that failed in the recorded attempt fails again.

    ``error`` is the recorded ``Type: message`` and ``failure_class`` the recorded
    class, so a failed attempt replays as failed, with the same class and message.
    Build one with ``recorded_failure``: it is also an instance of the ``JobError``
    of its class, so ``except ValidationError`` in a handler catches it in a replay
    as it caught the original.
    """

    failure_class: FailureClass = FailureClass.UNKNOWN

    def __init__(self, name: str, label: str, error: str | None) -> None:
        super().__init__(f"{name} {label!r} failed in the recording: {error}")
        self.error = error


_CLASS_ERRORS: dict[FailureClass, type[JobError]] = {
    FailureClass.TRANSIENT: TransientError,
    FailureClass.DEPENDENCY: DependencyError,
    FailureClass.CONCURRENCY: ConcurrencyError,
    FailureClass.VALIDATION: ValidationError,
}
_RECORDED_TYPES: dict[FailureClass, type[RecordedFailure]] = {
    failure_class: type(
        f"Recorded{base.__name__}", (RecordedFailure, base), {"failure_class": failure_class}
    )
    for failure_class, base in _CLASS_ERRORS.items()
}


def recorded_failure(
    name: str, label: str, error: str | None, error_class: str | None
) -> RecordedFailure:
    """The exception a replay raises for a recorded failure of ``name`` ``label``.

    ``error_class`` is the class recorded with the failure; older recordings that
    lack it are classed from the recorded exception type's name.
    """
    failure_class = failure_class_named(error_class) or failure_class_of_error(error)
    kind = _RECORDED_TYPES.get(failure_class, RecordedFailure)
    return kind(name, label, error)


def failure_class_named(name: str | None) -> FailureClass | None:
    try:
        return FailureClass(name) if name else None
    except ValueError:
        return None


def failure_class_of_error(error: str | None) -> FailureClass:
    """The class of a recorded ``Type: message`` from the type's name (``unknown`` if unsure)."""
    type_name = (error or "").partition(":")[0].strip()
    if not type_name:
        return FailureClass.UNKNOWN
    known: list[type[BaseException]] = [ValidationError, EffectInDoubtError]
    stack: list[type[BaseException]] = [JobError]
    while stack:
        cls = stack.pop()
        known.append(cls)
        stack.extend(cls.__subclasses__())
    for cls in known:
        if cls.__name__ == type_name and issubclass(cls, JobError):
            return cls.failure_class
    for exc_type, failure_class in DEFAULT_ERROR_MAP.items():
        if exc_type.__name__ == type_name:
            return failure_class
    return FailureClass.UNKNOWN


class UnrecordedIOError(ReplayqError, PermissionError):
    """Under the seal, handler code reached for the outside world without going through ``ctx``.

    ``call`` is the audit event (``socket.connect``, ``subprocess.Popen``, ``open``),
    ``target`` what it reached (``127.0.0.1:8123``, a command line, a path) and
    ``step`` the handler's step at the time (``None`` outside any step). The
    message reads ``unrecorded I/O at step 'charge': socket.connect 127.0.0.1:8123``.

    It is also a ``PermissionError`` because it is raised from inside the refused
    OS call: code that cleans up after a failed call still does (``socket.create_connection``
    closes its socket, ``importlib`` skips a bytecode write), and libraries that wrap
    ``OSError`` carry it (``urllib`` raises ``URLError`` with this as its ``reason``).
    The seal's report lists the call whatever the handler makes of the exception.
    """

    def __init__(self, call: str, target: str, step: str | None) -> None:
        where = f"at step {step!r}" if step is not None else "outside any step"
        super().__init__(f"unrecorded I/O {where}: {call} {target}")
        self.call = call
        self.target = target
        self.step = step


DEFAULT_ERROR_MAP: dict[type[BaseException], FailureClass] = {
    TimeoutError: FailureClass.TRANSIENT,
    ConnectionError: FailureClass.TRANSIENT,
    # The queue's own database unreachable mid-handler (a step's commit, a lock): retry.
    DatabaseUnavailableError: FailureClass.DEPENDENCY,
    # A write refused by a constraint (a unique key the handler's insert collides with):
    # the same write is refused again, so it is not retried unless the contract says so.
    ConstraintViolationError: FailureClass.VALIDATION,
}


def database_fault(exc: BaseException) -> StorageError | None:
    """The ``DatabaseUnavailableError`` or ``StorageClosedError`` that ``exc`` is, or was
    raised from or during.

    An attempt that ends with one (a step's commit, ``ctx.state``, ``ctx.lock``,
    ``ctx.enqueue`` meeting a locked, full or unreachable queue database, or the app's
    storage closed under it, even wrapped by the handler) did not fail by its own fault.
    """
    for current in _chain(exc):
        if isinstance(current, (DatabaseUnavailableError, StorageClosedError)):
            return current
    return None


def internal_violation(exc: BaseException) -> ConstraintViolationError | None:
    """The ``ConstraintViolationError`` of one of replayq's own tables (``internal``) that
    ``exc`` is, or was raised from or during: a write of replayq's refused by its own
    schema (a step's commit, an ack), a bug of replayq's, whatever the handler made of it."""
    for current in _chain(exc):
        if isinstance(current, ConstraintViolationError) and current.internal:
            return current
    return None


def internal_error_message(violation: ConstraintViolationError) -> str:
    """The error of an attempt ended by ``violation``, a constraint of replayq's own table
    refusing replayq's own write: said to be replayq's, naming the table and constraint
    (the worker's ``job.failed`` / ``job.dead``, and a replay's outcome now, say this)."""
    constraint = f" (constraint {violation.constraint})" if violation.constraint else ""
    return (
        f"{INTERNAL_ERROR_PREFIX}: its own table {violation.table} refused its write"
        f"{constraint}; a bug of replayq, not of the job: report it. "
        f"{type(violation).__name__}: {violation}"
    )


# How ``internal_error_message`` begins: a recorded or replayed error that does is replayq's.
INTERNAL_ERROR_PREFIX = "internal error of replayq"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or during, and so on (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__


def classify(
    exc: BaseException, mapping: dict[type[BaseException], FailureClass] | None = None
) -> FailureClass:
    """The failure class of ``exc``: its own class, then the contract's map, then defaults."""
    if isinstance(exc, JobError):
        return exc.failure_class
    for table in (mapping or {}, DEFAULT_ERROR_MAP):
        for exc_type, failure_class in table.items():
            if isinstance(exc, exc_type):
                return failure_class
    return FailureClass.UNKNOWN
