"""``replayq jobs requeue|cancel|dry-run`` over filters: a preview, then the action (``--yes``)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from typing import Any

import click

import replayq
from replayq.cli import render
from replayq.cli.env import Env, emit_json


def parse_moment(value: str | None, now: float, option: str) -> float | None:
    """``2h`` (that long before now), or an ISO 8601 time (UTC unless it names a zone)."""
    if value is None:
        return None
    try:
        return now - replayq.parse_duration(value, name=option)
    except replayq.ReplayqError:
        pass
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give a duration ago (2h, 30m) or a time (2026-11-30T18:00)",
            param_hint=option,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The filters every bulk action takes."""
    options = [
        click.option(
            "--state",
            "states",
            multiple=True,
            type=click.Choice([s.value for s in replayq.JobState]),
            help="Only jobs in this state (repeatable).",
        ),
        click.option("--type", "job_type", default=None, help="Only jobs of this type."),
        click.option("--version", default=None, help="Only jobs run by this handler version."),
        click.option("--queue", default=None, help="Only jobs on this queue."),
        click.option(
            "--error-class",
            default=None,
            help="Only jobs whose last error had this class (e.g. upstream_5xx).",
        ),
        click.option(
            "--since",
            default=None,
            help="Settled (or, if open, enqueued) at or after: 2h ago, or 2026-11-30T18:00.",
        ),
        click.option("--until", default=None, help="... and before this (same forms)."),
        click.option("--limit", default=10_000, show_default=True, help="Touch at most this many."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_match(
    app: replayq.App, default_states: tuple[str, ...], **filters: Any
) -> replayq.JobMatch:
    now = app.clock.now()
    return replayq.JobMatch(
        states=filters["states"] or default_states or None,
        job_type=filters["job_type"],
        version=filters["version"],
        queue=filters["queue"],
        error_class=filters["error_class"],
        since=parse_moment(filters["since"], now, "--since"),
        until=parse_moment(filters["until"], now, "--until"),
        limit=filters["limit"],
    )


def preview(app: replayq.App, match: replayq.JobMatch, action: str, as_json: bool) -> list[int]:
    """Print what the action would touch; returns the ids."""
    found = app.bulk_preview(match)
    if as_json:
        emit_json(
            {
                "action": action,
                "matched": found.matched,
                "job_ids": found.job_ids,
                "sample": [job.to_dict() for job in found.sample],
            }
        )
    else:
        click.echo(f"{action}: {found.matched} job(s) match")
        if found.sample:
            click.echo(render.job_table(found.sample))
    return found.job_ids


def run_bulk(
    env: Env, action: str, reason: str | None, yes: bool, as_json: bool, **filters: Any
) -> None:
    """Preview; with ``--yes``, act on exactly the previewed jobs with a progress bar."""
    app = env.app()
    default_states = {"requeue": ("dead",), "cancel": ("queued",)}[action]
    match = build_match(app, default_states, **filters)
    job_ids = preview(app, match, action, as_json and not yes)
    if not yes:
        if not as_json:
            click.echo(f"nothing changed; run again with --yes (and --reason) to {action} them")
        return
    if not reason or not reason.strip():
        raise click.UsageError(f"a bulk {action} needs --reason; it goes into each job's trace")
    from rich.progress import Progress

    with Progress(disable=as_json) as bar:
        task = bar.add_task(action, total=len(job_ids))
        result = app.bulk(
            action,
            match,
            reason=reason,
            job_ids=job_ids,
            progress=lambda n: bar.advance(task, n),
        )
    if as_json:
        emit_json(vars(result))
        return
    click.echo(
        f"{result.action_id}: {action} {len(result.changed)} job(s); "
        f"{len(result.skipped)} skipped (no longer {', '.join(match.states or ['any'])})"
    )


def bulk_dry_run(
    env: Env,
    app_spec: str,
    with_version: str | None,
    as_json: bool,
    *,
    keep: bool = True,
    processes: int = 1,
    **filters: Any,
) -> None:
    """Dry-run every matched job's recording; print the divergences summed up."""
    app = env.app(app_spec)
    match = build_match(app, ("succeeded", "dead", "failed"), **filters)
    found = app.bulk_preview(match, sample=0)
    outcomes: Counter[str] = Counter()
    diverged: list[dict[str, Any]] = []

    def could_not(job_id: int, exc: replayq.ReplayqError) -> None:
        outcomes["could not replay"] += 1
        diverged.append({"job_id": job_id, "divergence": f"could not replay: {exc}"})

    from rich.progress import Progress

    with Progress(disable=as_json) as bar:
        task = bar.add_task("dry-run", total=found.matched)
        reports = replayq.dry_run_many(
            app,
            found.job_ids,
            version=with_version,
            keep=keep,
            processes=processes,
            app=app_spec,
            on_error=could_not,
            progress=lambda n: bar.advance(task, n),
        )
    for report in reports:
        where = report.first_divergence or report.outcome_divergence
        outcomes["diverged" if where else "same"] += 1
        if where:
            diverged.append({"job_id": report.job_id, "divergence": str(where)})
    position = {job_id: n for n, job_id in enumerate(found.job_ids)}
    diverged.sort(key=lambda d: position[d["job_id"]])
    if as_json:
        emit_json({"matched": found.matched, "outcomes": dict(outcomes), "diverged": diverged})
        return
    click.echo(
        f"dry-run of {found.matched} job(s): "
        + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    )
    kinds = Counter(d["divergence"].split(":")[0] for d in diverged)
    for kind, count in kinds.most_common():
        click.echo(f"  {count:>6}  {kind}")
    for item in diverged[:10]:
        click.echo(f"  job {item['job_id']}: {item['divergence']}")
