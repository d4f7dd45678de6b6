"""The recording context: a handler's only door to the world.

Everything that passes through ``ctx`` is recorded as a domain event in the
job's trace, in the same transaction as the state it changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayq.jobs import Job
from replayq.storage.protocol import TraceEvent, Transaction

if TYPE_CHECKING:
    from replayq.app import App
    from replayq.handlers import Handler
    from replayq.worker import InFlight


class Context:
    """What a handler receives as its first argument."""

    def __init__(
        self,
        app: App,
        job: Job,
        handler: Handler,
        *,
        worker_id: str,
        flight: InFlight | None = None,
    ) -> None:
        self.app = app
        self.job = job
        self.handler = handler
        self.worker_id = worker_id
        self._flight = flight
        self._pending: list[TraceEvent] = []

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def trace_id(self) -> str:
        return self.job.trace_id

    @property
    def version(self) -> str:
        return self.handler.contract.version

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found this worker no longer holds the job's lease."""
        return self._flight is not None and self._flight.lost.is_set()

    def flush(self, tx: Transaction, *, failed: bool = False) -> None:
        """Write what the handler recorded since the last commit, in the caller's transaction."""
        tx.trace_append(self._pending)
        self._pending = []

    def _record(self, event: TraceEvent) -> None:
        self._pending.append(event)

    def __repr__(self) -> str:
        return f"<Context job={self.job.id} type={self.job.job_type} attempt={self.attempt}>"
