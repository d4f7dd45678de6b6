"""Incident signals counted from the trace: re-deliveries, idempotency conflicts, stale reads…

Each signal of seed 003's metric list that replayq records as a trace event is
counted per job type by ``replayq signals``; nothing is sampled or guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayq.runtime import RuntimeSource
from replayq.storage.reports import SignalCounts

SIGNALS: dict[str, str] = {
    "lease.expired": "lease-expiry re-deliveries",
    "job.write_rejected": "late writes rejected (lease lost)",
    "retry.scheduled": "retries scheduled",
    "job.dead": "dead-letter inflow",
    "job.deduplicated": "message-id dedup hits",
    "effect.deduplicated": "idempotency conflicts (effect not repeated)",
    "effect.in_doubt": "effects in doubt",
    "state.conflict": "optimistic write conflicts",
    "state.write_rejected": "writes rejected by fencing",
    "lock.expired": "locks expired before completion",
    "lock.timeout": "lock waits timed out",
    "cache.stale_read": "stale cache reads",
    "cache.decode_error": "cache entries that could not be decoded",
    "cache.encode_error": "cache values that could not be encoded",
}


@dataclass(frozen=True)
class SignalCount:
    job_type: str
    signal: str
    event: str
    count: int


def signal_counts(source: RuntimeSource, *, since: float | None = None) -> list[SignalCount]:
    """Counts per job type of every signal event since ``since`` (default: all time)."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        rows = tx.report(SignalCounts(list(SIGNALS), since if since is not None else 0.0))
    return [SignalCount(job_type, SIGNALS[name], name, count) for job_type, name, count in rows]
