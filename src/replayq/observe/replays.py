"""Replay and fork outcomes for the fleet endpoint: replay success and fork divergence.

Replays, forks and reruns run in CLI and dashboard processes, not in workers, so
they are counted from the database: each derived trace (a lineage row) once it has
finished, by ``job_type`` (of the original job), ``version`` (the code it ran),
``mode`` (``replay`` for a dry-run, ``fork``, ``rerun``), ``outcome`` (how the
derived run ended: ``succeeded``/``failed``) and ``diverged`` (``true`` when its
diff against the original attempt, what ``replayq diff`` shows, is not empty).
Replay success rate is ``diverged="false"`` over all of ``mode="replay"``; fork
divergence rate is ``diverged="true"`` over all of ``mode="fork"``.

The counts start from zero in each ``metrics serve`` process and catch up on the
history at most ``BUDGET`` derived traces per scrape (each costs a diff), so a big
history takes a few scrapes to be counted; a trace still running is looked at
again at the next scrape, and counted as ``incomplete`` once it is ``GIVE_UP``
seconds old (its process died). A dry-run that wrote nothing (``keep=False``, as
``rollout verify`` runs) leaves no trace and is not counted.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from msgspec import structs

from replayq.errors import ReplayqError
from replayq.replay.diff import diff_traces, ending
from replayq.runtime import RuntimeSource
from replayq.storage.context_params import LineageQuery

BUDGET = 200
GIVE_UP = 3600.0
LABELS = ("job_type", "version", "mode", "outcome", "diverged")


class DerivedRuns:
    """Counts of finished derived traces, read incrementally from the lineage table."""

    def __init__(self, source: RuntimeSource) -> None:
        self.runtime = source.runtime
        self.counts: Counter[tuple[str, ...]] = Counter()
        self._cursor: tuple[float, str] = (0.0, "")
        self._running: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Count the derived traces that finished since the last call (up to ``BUDGET``)."""
        with self._lock:
            budget = BUDGET
            now = self.runtime.clock.now()
            for trace_id, row in list(self._running.items()):
                if budget <= 0:
                    return
                budget -= 1
                if self._count(row, give_up=now - float(row["created_at"]) > GIVE_UP):
                    del self._running[trace_id]
            with self.runtime.storage.transaction(readonly=True) as tx:
                page = LineageQuery(after=self._cursor, limit=budget)
                rows = [structs.asdict(r) for r in tx.lineage_list(page)] if budget else []
            for row in rows:
                self._cursor = (float(row["created_at"]), str(row["trace_id"]))
                if not self._count(row):
                    self._running[str(row["trace_id"])] = row

    def _count(self, row: dict[str, Any], give_up: bool = False) -> bool:
        """Count one derived trace; ``False`` while it has not finished."""
        if row["source_job_id"] is None:
            return True  # not derived from a job (nothing to compare with)
        try:
            diff = diff_traces(self.runtime, str(row["source_job_id"]), str(row["trace_id"]))
        except ReplayqError:
            return True  # the original is gone (retention): nothing to compare with
        outcome = ending(diff.outcome["b"])
        if outcome in ("unknown", "incomplete"):
            if not give_up:
                return False
            outcome = "incomplete"
        with self.runtime.storage.transaction(readonly=True) as tx:
            job = tx.job_get(int(row["source_job_id"]))
        details = json.loads(row["details"] or "{}")
        self.counts[
            (
                job.job_type if job else "unknown",
                str(details.get("version") or "none"),
                str(row["origin"]),
                outcome,
                "true" if diff.diverged else "false",
            )
        ] += 1
        return True
