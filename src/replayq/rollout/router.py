"""The worker's view of routing: every type's record, read again at most every half second.

A change made with ``replayq rollout`` reaches every worker within
``REFRESH_SECONDS`` plus one lease round. The read runs inside the lease's own
transaction, so a lease never mixes two revisions of one type's routing.
"""

from __future__ import annotations

import logging
import threading
import time

from replayq.model import Job
from replayq.queue.handlers import HandlerRegistry
from replayq.rollout.routing import Routing
from replayq.storage.protocol import Transaction

log = logging.getLogger("replayq.rollout")

REFRESH_SECONDS = 0.5


class Router:
    """Routing records cached for ``refresh_seconds``; chooses a leased job's version."""

    def __init__(self, registry: HandlerRegistry, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.registry = registry
        self.refresh_seconds = refresh_seconds
        self._routes: dict[str, Routing] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def refresh(self, tx: Transaction, *, force: bool = False) -> dict[str, Routing]:
        """The routing records, read from ``tx`` if the cached ones are older than the refresh."""
        with self._lock:
            now = time.monotonic()
            if force or now - self._read_at >= self.refresh_seconds:
                self._routes = {r["job_type"]: Routing.from_row(r) for r in tx.routing_list()}
                self._read_at = now
            return self._routes

    def routed_types(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._routes)

    def choose(self, job: Job) -> str | None:
        """The version this worker runs ``job`` under; ``None``: keep what the lease set.

        A job that already has a version keeps it if this worker declares it. A
        version this worker does not declare (a routing naming a version deployed
        elsewhere, or a version since removed) falls back to the baseline, else to
        the worker's active version, and the move is logged.
        """
        declared = self.registry.versions(job.job_type)
        if not declared:
            return None
        if job.handler_version is not None and job.handler_version in declared:
            return None
        with self._lock:
            routing = self._routes.get(job.job_type)
        wanted = routing.choose(job) if routing is not None else None
        if job.handler_version is not None and wanted is None:
            wanted = self.registry.active_version(job.job_type)
        for candidate in (
            wanted,
            routing.baseline if routing else None,
            self.registry.active_version(job.job_type),
        ):
            if candidate is not None and candidate in declared:
                if job.handler_version is not None:
                    log.warning(
                        "job %s: version %s is not declared here, running %s",
                        job.id,
                        job.handler_version,
                        candidate,
                    )
                return candidate
        return None
