"""replayq: a job queue whose executions can be traced, replayed, forked and reversed.

The public API, by layer (everything a user or the ``replayq`` command line needs):

* the facade: ``App`` (declare job types, enqueue, inspect), ``Worker``, ``Context``
  (the ``ctx`` a handler receives) and the records ``Job``, ``JobState``,
  ``DeadReason``, ``TraceEvent``, ``Entity``, ``StateStore``;
* contracts: ``JobContract``, ``Retry``, ``diff_contracts``, ``lint_contract``;
* periodic jobs: ``Schedule``, ``ScheduleStatus``, ``MissedSlots`` (``App.periodic``);
* bulk actions: ``JobMatch`` (the filters), ``BulkPreview``, ``BulkResult`` (``App.bulk``);
* the replay engine: ``trace_replay``, ``dry_run``, ``dry_run_many``, ``fork``, ``rerun``,
  ``rerun_many``, ``plan_rollback``, ``rollback``, ``compensate``,
  ``diff_traces``, ``render_diff``, ``uncommitted_writes``, ``export_case``,
  ``import_case``, ``signal_counts``;
* questions across jobs by time: ``events_between`` (``WindowEvent``), ``signal_series``
  (``SignalPoint``);
* rollouts: ``freeze_contracts``/``check_contracts`` (``replayq.contracts.lock``),
  ``Rollout`` (``App.rollout(type)``), ``Routing``, ``PinRule``,
  ``RoutingChange``, ``RollbackResult``, ``Gate``, ``GateReport``, ``verify_rollout`` and its
  ``VerifyReport`` of ``AttemptComparison``s, ``start_verify`` (in the background,
  resumable) and its ``VerifyRun`` (``verify_run``, ``verify_runs``);
* shared resources: ``list_locks``, ``break_lock``, ``open_sink``, ``publish_pending``;
* retention: ``Retention`` (``App(retention=..., retention_by_type=...)``), ``App.gc`` and
  its ``GcReport``, ``App.keep``;
* clocks: ``Clock``, ``SystemClock``, ``FrozenClock``, ``HybridLogicalClock``;
* observing: ``Observer`` (what a ``Worker(observers=...)`` is told; ``ReleaseReason``
  says why a leased job left unrun), ``WorkerMetrics``
  (Prometheus, needs ``[metrics]``), ``fleet_registry`` and ``serve_metrics``,
  ``configure_logging``, ``AttemptTracer``, ``otel_provider_from_env`` and ``otel_trace_id``
  (OpenTelemetry, ``[otel]``);
* every exception replayq raises (the tree is drawn in ``replayq.errors``).

``replayq.testing`` holds the helpers for users' own test suites; ``replayq.contrib``
the integrations (Django, SQLAlchemy). ``replayq.__version__`` is the installed version.
"""

import importlib as _importlib
import typing as _typing

from replayq.app import App, EnqueueRequest
from replayq.clock import Clock, FrozenClock, HybridLogicalClock, SystemClock
from replayq.durations import parse_duration
from replayq.errors import (
    CallbackReentryError,
    ConcurrencyError,
    ConfigurationError,
    ConstraintViolationError,
    ContextEndedError,
    ContractError,
    DatabaseUnavailableError,
    DependencyError,
    EffectInDoubtError,
    EffectRefusedError,
    FailureClass,
    JobCancelledError,
    JobError,
    LeaseLostError,
    LockTimeoutError,
    PayloadError,
    RecordedFailure,
    ReplayDivergenceError,
    ReplayqError,
    RollbackRefusedError,
    RolloutRefusedError,
    SchemaError,
    StaleFencingTokenError,
    StepLeftOpenError,
    StorageClosedError,
    StorageError,
    StorageUnavailableError,
    TransientError,
    UnknownJobTypeError,
    ValidationError,
)
from replayq.model import DeadReason, Job, JobState, StatRow, TraceEvent
from replayq.observe.hooks import Observer, ReleaseReason
from replayq.observe.logs import configure_logging
from replayq.observe.otel import AttemptTracer, otel_provider_from_env, otel_trace_id
from replayq.queue.contracts import JobContract, Retry, diff_contracts, lint_contract
from replayq.queue.retention import GcReport, Retention
from replayq.queue.schedule import MissedSlots, Schedule
from replayq.queue.scheduler import ScheduleStatus
from replayq.recording.context import Context
from replayq.recording.in_doubt import EffectRecord, EffectResolution
from replayq.recording.locks import break_lock, list_locks
from replayq.recording.outbox import open_sink, publish_pending
from replayq.recording.state import Entity, StateStore
from replayq.redaction import Redaction
from replayq.storage.protocol import JobMatch
from replayq.worker import Worker

# The replay engine, rollouts and the metrics exporters load on first use (PEP 562):
# an app and its workers need none of them, and every process paid for them at start
# (issue 13). Each name maps to (module, name there); the imports below are for type checkers.
_ON_FIRST_USE = {
    "AttemptComparison": ("replayq.rollout.verify", "AttemptComparison"),
    # Bulk actions' results: a worker never builds one (two frozen dataclasses at start).
    "BulkPreview": ("replayq.queue.bulk", "BulkPreview"),
    "BulkResult": ("replayq.queue.bulk", "BulkResult"),
    "Gate": ("replayq.rollout.gates", "Gate"),
    "GateReport": ("replayq.rollout.gates", "GateReport"),
    "LockDifference": ("replayq.rollout.lockfile", "LockDifference"),
    "PinRule": ("replayq.rollout.routing", "PinRule"),
    "ReplayReport": ("replayq.replay.engine", "ReplayReport"),
    "RerunReport": ("replayq.replay.rerun", "RerunReport"),
    "RollbackResult": ("replayq.rollout.control", "RollbackResult"),
    "Rollout": ("replayq.rollout.control", "Rollout"),
    "Routing": ("replayq.rollout.routing", "Routing"),
    "RoutingChange": ("replayq.rollout.control", "RoutingChange"),
    "SignalPoint": ("replayq.replay.window", "SignalPoint"),
    "VerifyReport": ("replayq.rollout.verify", "VerifyReport"),
    "VerifyRun": ("replayq.rollout.background", "VerifyRun"),
    "WindowEvent": ("replayq.replay.window", "WindowEvent"),
    "WorkerMetrics": ("replayq.observe.metrics", "WorkerMetrics"),
    "check_contracts": ("replayq.rollout.lockfile", "check"),
    "compensate": ("replayq.replay.rollback", "compensate"),
    "diff_traces": ("replayq.replay.diff", "diff_traces"),
    "dry_run": ("replayq.replay.engine", "dry_run"),
    "dry_run_many": ("replayq.replay.engine", "dry_run_many"),
    "events_between": ("replayq.replay.window", "events_between"),
    "export_case": ("replayq.replay.export", "export_case"),
    "fleet_registry": ("replayq.observe.fleet", "fleet_registry"),
    "fork": ("replayq.replay.engine", "fork"),
    "freeze_contracts": ("replayq.rollout.lockfile", "freeze"),
    "import_case": ("replayq.replay.export", "import_case"),
    "plan_rollback": ("replayq.replay.rollback", "plan_rollback"),
    "render_diff": ("replayq.replay.diff", "render"),
    "rerun": ("replayq.replay.rerun", "rerun"),
    "rerun_many": ("replayq.replay.rerun", "rerun_many"),
    "rollback": ("replayq.replay.rollback", "rollback"),
    "serve_metrics": ("replayq.observe.metrics", "serve"),
    "signal_counts": ("replayq.replay.signals", "signal_counts"),
    "signal_series": ("replayq.replay.window", "signal_series"),
    "start_verify": ("replayq.rollout.background", "start_verify"),
    "trace_replay": ("replayq.replay.engine", "trace_replay"),
    "uncommitted_writes": ("replayq.replay.diff", "uncommitted_writes"),
    "verify_rollout": ("replayq.rollout.verify", "verify_rollout"),
    "verify_run": ("replayq.rollout.background", "verify_run"),
    "verify_runs": ("replayq.rollout.background", "verify_runs"),
}

if _typing.TYPE_CHECKING:
    from replayq.observe.fleet import fleet_registry
    from replayq.observe.metrics import WorkerMetrics
    from replayq.observe.metrics import serve as serve_metrics
    from replayq.queue.bulk import BulkPreview, BulkResult
    from replayq.replay.diff import diff_traces, uncommitted_writes
    from replayq.replay.diff import render as render_diff
    from replayq.replay.engine import ReplayReport, dry_run, dry_run_many, fork, trace_replay
    from replayq.replay.export import export_case, import_case
    from replayq.replay.rerun import RerunReport, rerun, rerun_many
    from replayq.replay.rollback import compensate, plan_rollback, rollback
    from replayq.replay.signals import signal_counts
    from replayq.replay.window import SignalPoint, WindowEvent, events_between, signal_series
    from replayq.rollout.background import VerifyRun, start_verify, verify_run, verify_runs
    from replayq.rollout.control import RollbackResult, Rollout, RoutingChange
    from replayq.rollout.gates import Gate, GateReport
    from replayq.rollout.lockfile import LockDifference
    from replayq.rollout.lockfile import check as check_contracts
    from replayq.rollout.lockfile import freeze as freeze_contracts
    from replayq.rollout.routing import PinRule, Routing
    from replayq.rollout.verify import AttemptComparison, VerifyReport, verify_rollout

    __version__: str


def __getattr__(name: str) -> _typing.Any:
    """A name of ``_ON_FIRST_USE`` or ``__version__``, imported now and kept."""
    if name == "__version__":
        value: _typing.Any = _installed_version()
    elif name in _ON_FIRST_USE:
        module, attribute = _ON_FIRST_USE[name]
        value = getattr(_importlib.import_module(module), attribute)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE, "__version__"})


def _installed_version() -> str:
    # Imported here: importlib.metadata (email, zipfile, csv) is --version's alone.
    import importlib.metadata

    try:
        return importlib.metadata.version("replayq")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__all__ = [
    "App",
    "AttemptComparison",
    "AttemptTracer",
    "BulkPreview",
    "BulkResult",
    "CallbackReentryError",
    "Clock",
    "ConcurrencyError",
    "ConfigurationError",
    "ConstraintViolationError",
    "Context",
    "ContextEndedError",
    "ContractError",
    "DatabaseUnavailableError",
    "DeadReason",
    "DependencyError",
    "EffectInDoubtError",
    "EffectRecord",
    "EffectRefusedError",
    "EffectResolution",
    "EnqueueRequest",
    "Entity",
    "FailureClass",
    "FrozenClock",
    "Gate",
    "GateReport",
    "GcReport",
    "HybridLogicalClock",
    "Job",
    "JobCancelledError",
    "JobContract",
    "JobError",
    "JobMatch",
    "JobState",
    "LeaseLostError",
    "LockDifference",
    "LockTimeoutError",
    "MissedSlots",
    "Observer",
    "PayloadError",
    "PinRule",
    "RecordedFailure",
    "Redaction",
    "ReleaseReason",
    "ReplayDivergenceError",
    "ReplayReport",
    "ReplayqError",
    "RerunReport",
    "Retention",
    "Retry",
    "RollbackRefusedError",
    "RollbackResult",
    "Rollout",
    "RolloutRefusedError",
    "Routing",
    "RoutingChange",
    "Schedule",
    "ScheduleStatus",
    "SchemaError",
    "SignalPoint",
    "StaleFencingTokenError",
    "StatRow",
    "StateStore",
    "StepLeftOpenError",
    "StorageClosedError",
    "StorageError",
    "StorageUnavailableError",
    "SystemClock",
    "TraceEvent",
    "TransientError",
    "UnknownJobTypeError",
    "ValidationError",
    "VerifyReport",
    "VerifyRun",
    "WindowEvent",
    "Worker",
    "WorkerMetrics",
    "break_lock",
    "check_contracts",
    "compensate",
    "configure_logging",
    "diff_contracts",
    "diff_traces",
    "dry_run",
    "dry_run_many",
    "events_between",
    "export_case",
    "fleet_registry",
    "fork",
    "freeze_contracts",
    "import_case",
    "lint_contract",
    "list_locks",
    "open_sink",
    "otel_provider_from_env",
    "otel_trace_id",
    "parse_duration",
    "plan_rollback",
    "publish_pending",
    "render_diff",
    "rerun",
    "rerun_many",
    "rollback",
    "serve_metrics",
    "signal_counts",
    "signal_series",
    "start_verify",
    "trace_replay",
    "uncommitted_writes",
    "verify_rollout",
    "verify_run",
    "verify_runs",
]
