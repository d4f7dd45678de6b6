"""Human-readable renderings of jobs, traces and stats for the CLI."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import replayq
from replayq import HybridLogicalClock, Job, StatRow, TraceEvent

_SKIP_DATA = {"traceback", "read"}


def timestamp(value: float | None) -> str:
    if value is None:
        return "-"
    moment = dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def date_time(value: float | None) -> str:
    """A moment as ``2026-11-30 18:05:00Z`` (UTC); ``-`` for none."""
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _brief(value: Any, width: int = 60) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def event_line(event: TraceEvent, *, show_job: bool = False, mark: str | None = None) -> str:
    """One event as one line: time, attempt, worker, name, step, details (and ``mark``)."""
    parts = [timestamp(event.ts)]
    if show_job:
        parts.append(f"job {event.job_id}" if event.job_id is not None else event.trace_id)
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
    if mark:
        parts.append(mark)
    expired_owner = event.data.get("expired_owner") if event.name == "lease.expired" else None
    if expired_owner:
        # The lease that expired was the owner's; the worker that noticed is only the reaper.
        parts.append(f"({expired_owner}; reaped by {event.worker_id or '-'})")
    elif event.worker_id:
        parts.append(f"({event.worker_id})")
    return "  ".join(parts)


def timeline(events: Sequence[TraceEvent], *, show_job: bool = False) -> str:
    """Events one per line; a state write that never committed is marked with why."""
    if not events:
        return "(no events)"
    dropped = replayq.uncommitted_writes(list(events))
    lines = []
    first = HybridLogicalClock.physical_ms(events[0].hlc)
    for event in events:
        offset = HybridLogicalClock.physical_ms(event.hlc) - first
        key = (event.trace_id, event.attempt, event.seq)
        mark = dropped.get(key) if event.name == "state.write" else None
        lines.append(f"+{offset:>7}ms  " + event_line(event, show_job=show_job, mark=mark))
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
        error = f"[{job.last_error_class}] {job.last_error}" if job.last_error else ""
        reason = f"{job.dead_reason}: {error}" if job.dead_reason and error else None
        shown = _brief(reason or job.dead_reason or error, 90)
        lines.append(
            f"{job.id:>6}  {job.job_type:<22} {job.state.value:<10} "
            f"{job.attempt:>2}/{job.max_attempts:<2}  {shown}"
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


def outcome_text(outcome: Any) -> str:
    """``succeeded``, or ``failed [class] message``: a text report always says why."""
    if outcome.status == "failed":
        return f"failed [{outcome.error_class or 'unknown'}] {outcome.error or ''}".rstrip()
    if outcome.status == "incomplete" and outcome.error:
        return f"incomplete ({outcome.error})"
    return str(outcome.status)


def replay_report(report: Any) -> str:
    """A dry-run or fork report: outcome, retry decision, first divergence, differences."""
    lines = [
        f"{report.mode} of job {report.job_id} attempt {report.attempt} with {report.version}",
        f"  derived trace: {report.trace_id} (branch {report.branch})",
    ]
    if report.fork_step:
        lines.append(f"  fork point: step {report.fork_step!r} (reached: {report.reached_fork})")
    lines.append(f"  outcome recorded: {outcome_text(report.outcome_recorded)}")
    lines.append(f"  outcome now:      {outcome_text(report.outcome_now)}")
    if report.retry_recorded or report.retry_now:
        lines.append(f"  decision recorded: {report.retry_recorded or '-'}")
        lines.append(f"  decision now:      {report.retry_now or '-'}")
    if report.error:
        lines.append(f"  stopped: {report.error}")
    for line in report.unrecorded_io:
        lines.append(f"  UNRECORDED I/O, refused: {line}")
    for line in report.allowed_io:
        lines.append(f"  WARNING --allow-io: real I/O that bypassed ctx happened: {line}")
    where = report.first_divergence
    if where is not None:
        lines.append(f"  FIRST DIVERGENCE at step {where.step!r}, event #{where.index}")
        lines.append(f"    recorded (seq {where.recorded_seq}): {where.recorded}")
        lines.append(f"    now      (seq {where.now_seq}): {where.now}")
        lines.append(f"    {where.reason}")
    if report.outcome_divergence:
        lines.append(f"  OUTCOME DIVERGES: {report.outcome_divergence}")
    if not report.diverged:
        lines.append("  no divergence: the run matched the recording event by event")
    for row in report.decisions:
        lines.append(f"  decision {row['decision']}: recorded {row['recorded']} now {row['now']}")
    for row in report.state_writes:
        lines.append(f"  state {row['resource']}: recorded {row['recorded']} now {row['now']}")
    return "\n".join(lines)


def written_by(version: Any) -> str:
    """Who wrote a state version: a job's attempt, a rollback, or a write from outside a job."""
    trace_id = version.trace_id or ""
    if trace_id.startswith("rollback:"):
        job = trace_id.removeprefix("rollback:").removeprefix("job-").split(":", 1)[0]
        return f"rollback of job {job}" if job.isdigit() else "rollback"
    if version.job_id is not None:
        return f"job {version.job_id} attempt {version.attempt or '-'}"
    return "outside a job"


def state_history(versions: Sequence[Any]) -> str:
    """Every version of an entity: number, parent, who wrote it, fencing token, time, delta."""
    import json

    lines = []
    for v in versions:
        lines.append(
            f"v{v.version:<4} parent={v.parent_version or '-':<4} by={written_by(v):<28} "
            f"token={v.fencing_token or '-':<4} {timestamp(v.created_at)}  "
            f"delta={json.dumps(v.delta, sort_keys=True, default=str)}"
        )
    return "\n".join(lines) or "(no versions)"
