"""Human-readable renderings of jobs, traces and stats for the CLI."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from replayq import Job, StatRow, TraceEvent
from replayq.clock import HybridLogicalClock

_SKIP_DATA = {"traceback", "read"}


def timestamp(value: float | None) -> str:
    if value is None:
        return "-"
    moment = dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _brief(value: Any, width: int = 60) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def event_line(event: TraceEvent, *, show_job: bool = False) -> str:
    """One event as one line: time, attempt, worker, name, step, details."""
    parts = [timestamp(event.ts)]
    if show_job:
        parts.append(f"job {event.job_id}")
    parts.append(f"#{event.attempt}" if event.attempt is not None else "  ")
    parts.append(f"{event.name:<20}")
    if event.step:
        parts.append(f"[{event.step}]")
    if event.resource:
        version = f"@v{event.resource_version}" if event.resource_version is not None else ""
        parts.append(f"{event.resource}{version}")
    if event.status:
        parts.append(event.status)
    if event.side_effect:
        parts.append("SIDE-EFFECT")
    details = [
        f"{k}={_brief(v)}" for k, v in event.data.items() if v is not None and k not in _SKIP_DATA
    ]
    if details:
        parts.append(" ".join(details))
    if event.worker_id:
        parts.append(f"({event.worker_id})")
    return "  ".join(parts)


def timeline(events: Sequence[TraceEvent], *, show_job: bool = False) -> str:
    if not events:
        return "(no events)"
    lines = []
    first = HybridLogicalClock.physical_ms(events[0].hlc)
    for event in events:
        offset = HybridLogicalClock.physical_ms(event.hlc) - first
        lines.append(f"+{offset:>7}ms  " + event_line(event, show_job=show_job))
    return "\n".join(lines)


def job_detail(job: Job) -> str:
    rows = [
        ("id", job.id),
        ("type", job.job_type),
        ("state", job.state.value),
        ("attempt", f"{job.attempt}/{job.max_attempts}"),
        ("redeliveries", job.redelivery_count),
        ("queue", job.queue),
        ("priority", job.priority),
        ("version", job.handler_version or "-"),
        ("trace", job.trace_id),
        ("message id", job.message_id or "-"),
        ("ordering key", job.ordering_key or "-"),
        ("idempotency key", job.idempotency_key or "-"),
        ("worker", job.worker_id or "-"),
        ("lease deadline", timestamp(job.lease_deadline)),
        ("created", timestamp(job.created_at)),
        ("run at", timestamp(job.run_at)),
        ("finished", timestamp(job.finished_at)),
        ("last error", f"[{job.last_error_class}] {job.last_error}" if job.last_error else "-"),
        ("dead reason", job.dead_reason or "-"),
        ("payload", job.payload),
        ("result", job.result),
    ]
    return "\n".join(f"{name:>16}: {value}" for name, value in rows)


def job_table(jobs: Sequence[Job]) -> str:
    if not jobs:
        return "(no jobs)"
    header = f"{'id':>6}  {'type':<22} {'state':<10} {'att':>5}  {'reason / error'}"
    lines = [header]
    for job in jobs:
        reason = job.dead_reason or (job.last_error or "")
        lines.append(
            f"{job.id:>6}  {job.job_type:<22} {job.state.value:<10} "
            f"{job.attempt:>2}/{job.max_attempts:<2}  {_brief(reason, 50)}"
        )
    return "\n".join(lines)


def stats_table(rows: Sequence[StatRow], now: float) -> str:
    if not rows:
        return "(no jobs)"
    lines = [f"{'type':<24} {'state':<10} {'count':>7}  oldest queued age"]
    for row in rows:
        age = ""
        if row.state == "queued" and row.oldest_run_at is not None:
            age = f"{max(0.0, now - row.oldest_run_at):.1f}s"
        lines.append(f"{row.job_type:<24} {row.state:<10} {row.count:>7}  {age}")
    return "\n".join(lines)
