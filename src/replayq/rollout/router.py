"""The worker's view of routing: every type's record, read again at most every half second.

A change made with ``replayq rollout`` reaches every worker within
``REFRESH_SECONDS`` plus one lease round. The read runs inside the lease's own
transaction, so a lease never mixes two revisions of one type's routing. A lease
batch holding a routed job that ran before (a retry, a redelivery) reads it again
whatever its age (``worker/lease.py``): after a rollback such a job moves to the
baseline at its next lease, not half a second later.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from replayq.model import Job
from replayq.queue.handlers import HandlerRegistry
from replayq.storage.params import RoutingQuery
from replayq.storage.protocol import Transaction

if TYPE_CHECKING:
    from replayq.rollout.routing import Routing

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
                rows = tx.rollout_query(RoutingQuery())
                if rows:
                    # Imported here: most workers' types have no routing.
                    from replayq.rollout.routing import Routing

                    self._routes = {r.job_type: Routing.from_row(r) for r in rows}
                else:
                    self._routes = {}
                self._read_at = now
            return self._routes

    def routed_types(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._routes)

    def is_routed(self, job_type: str) -> bool:
        """Whether ``job_type`` has routing records (``routed_types`` for one type, asked
        for every success: no lock and no set). ``refresh`` replaces the mapping whole,
        never changes it in place, so one read of it is consistent."""
        return job_type in self._routes

    def comparisons_for(self, job: Job, ran: str) -> list[tuple[str, str]]:
        """``(mode, version)`` runs to compare with a settled attempt of ``job`` on ``ran``."""
        # No lock: ``refresh`` replaces the mapping whole (as for ``is_routed``).
        routing = self._routes.get(job.job_type)
        if routing is None or ran != routing.baseline:
            return []
        declared = self.registry.versions(job.job_type)
        wanted = []
        if routing.dual_run_version:
            wanted.append(("dual-run", routing.dual_run_version))
        elif routing.shadow_version and routing.shadows(job):
            wanted.append(("shadow", routing.shadow_version))
        return [(m, v) for m, v in wanted if v != ran and v in declared]

    def choose(self, job: Job) -> str | None:
        """The version this worker runs ``job`` under; ``None``: keep what the lease set.

        A job keeps the version of its first lease through every later attempt,
        as long as its type's routing still names that version (weights, even at
        0 %, pins, baseline). After a rollback it does not: the job's next attempt
        runs on the baseline (its attempt in flight finished where it ran). A
        version this worker does not declare (deployed elsewhere, or since
        removed) falls back to the baseline, else to the worker's active version.
        """
        declared = self.registry.versions(job.job_type)
        if not declared:
            return None
        routing = self._routes.get(job.job_type)  # no lock, as ``comparisons_for``
        kept = job.handler_version
        still_routed = routing is None or kept in routing.versions()
        if kept is not None and kept in declared and still_routed:
            return None
        wanted = routing.choose(job) if routing is not None and kept is None else None
        for candidate in (
            wanted,
            routing.baseline if routing else None,
            self.registry.active_version(job.job_type),
        ):
            if candidate is not None and candidate in declared:
                if kept is not None:
                    log.info("job %s: version %s moved to %s at its lease", job.id, kept, candidate)
                return candidate
        return None
