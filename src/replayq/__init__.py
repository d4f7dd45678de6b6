"""replayq: a job queue whose executions can be traced, replayed, forked and reversed."""

from replayq.app import App, EnqueueRequest
from replayq.clock import Clock, FrozenClock, HybridLogicalClock, SystemClock
from replayq.errors import (
    ConcurrencyError,
    ConfigurationError,
    ContractError,
    DatabaseUnavailableError,
    DependencyError,
    FailureClass,
    JobError,
    LeaseLostError,
    PayloadError,
    ReplayqError,
    SchemaError,
    StorageError,
    TransientError,
    UnknownJobTypeError,
    ValidationError,
)
from replayq.model import DeadReason, Job, JobState
from replayq.queue.contracts import JobContract, Retry
from replayq.recording.context import Context
from replayq.worker import Worker

__all__ = [
    "App",
    "Clock",
    "ConcurrencyError",
    "ConfigurationError",
    "Context",
    "ContractError",
    "DatabaseUnavailableError",
    "DeadReason",
    "DependencyError",
    "EnqueueRequest",
    "FailureClass",
    "FrozenClock",
    "HybridLogicalClock",
    "Job",
    "JobContract",
    "JobError",
    "JobState",
    "LeaseLostError",
    "PayloadError",
    "ReplayqError",
    "Retry",
    "SchemaError",
    "StorageError",
    "SystemClock",
    "TransientError",
    "UnknownJobTypeError",
    "ValidationError",
    "Worker",
]
