"""``replayq replay``, ``fork``, ``diff``, ``rerun``, ``rollback``: the replay engine."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

import replayq
from replayq.cli import render
from replayq.cli.env import Env, JobId, emit_json, pass_env


def _parse_assignments(items: tuple[str, ...], what: str) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: use {what} field=value")
        try:
            parsed[name] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[name] = raw
    return parsed


def _print_report(report: Any, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(render.replay_report(report))


@click.command()
@click.argument("job_id", type=JobId)
@click.option("--app", "app_spec", default=None, help="module:attribute (needed to execute).")
@click.option(
    "--mode",
    type=click.Choice(["trace", "dry-run"]),
    default="trace",
    show_default=True,
    help="trace: show what was recorded; dry-run: run the handler on recorded answers.",
)
@click.option("--attempt", type=int, default=None, help="Which attempt (default: the last).")
@click.option("--version", default=None, help="Run this declared handler version.")
@click.option("--handler", "handler_spec", default=None, help="Run module:function instead.")
@click.option("--allow-io", is_flag=True, help="Let handler I/O that bypasses ctx happen.")
@click.option("--no-keep", is_flag=True, help="Dry-run: write nothing (no derived trace, branch).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def replay(
    env: Env,
    job_id: int,
    app_spec: str | None,
    mode: str,
    attempt: int | None,
    version: str | None,
    handler_spec: str | None,
    allow_io: bool,
    no_keep: bool,
    as_json: bool,
) -> None:
    """Trace replay (no execution) or deterministic dry-run (exit 1 if it diverged).

    The dry-run is sealed: handler I/O that bypasses ctx (sockets, host names,
    subprocesses, file writes) is refused and reported; --allow-io lets it happen.
    It writes its trace, branch state and lineage once at the end; --no-keep writes
    nothing (verification only: the report is the result).
    """

    app = env.app(app_spec)
    app.get_job(job_id)  # a missing job is an error (exit 2), not an empty timeline
    if mode == "trace":
        timelines = replayq.trace_replay(app, job_id)
        if as_json:
            emit_json(
                [
                    {
                        "attempt": t.attempt,
                        "worker": t.worker_id,
                        "side_effect_steps": t.side_effect_steps,
                        "events": [vars(e) for e in t.events],
                    }
                    for t in timelines
                ]
            )
            return
        for t in timelines:
            label = "enqueue" if t.attempt == 0 else f"attempt {t.attempt}"
            effects = ", ".join(t.side_effect_steps) or "none"
            click.echo(f"== {label} (worker {t.worker_id or '-'}; real side effects in: {effects})")
            click.echo(render.timeline(t.events))
        return
    if app_spec is None:
        raise click.UsageError("--mode dry-run executes handler code: give --app module:app")
    report = replayq.dry_run(
        app,
        job_id,
        attempt=attempt,
        version=version,
        handler=handler_spec,
        allow_io=allow_io,
        keep=not no_keep,
    )
    _print_report(report, as_json)
    sys.exit(1 if report.diverged else 0)


@click.command("fork")
@click.argument("job_id", type=JobId)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--from-step", required=True, help="Re-execute from this step on.")
@click.option("--attempt", type=int, default=None, help="Which attempt (default: the last).")
@click.option("--version", default=None, help="Run this declared handler version.")
@click.option("--handler", "handler_spec", default=None, help="Run module:function instead.")
@click.option("--override", "overrides", multiple=True, help="payload field=value (JSON)")
@click.option("--stub", "stubs", multiple=True, help="call-or-effect-name=JSON result")
@click.option("--allow-io", is_flag=True, help="Let handler I/O that bypasses ctx happen.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def fork_command(
    env: Env,
    job_id: int,
    app_spec: str,
    from_step: str,
    attempt: int | None,
    version: str | None,
    handler_spec: str | None,
    overrides: tuple[str, ...],
    stubs: tuple[str, ...],
    allow_io: bool,
    as_json: bool,
) -> None:
    """Branch state before a step and run another version from there; never the real world.

    Sealed like a dry-run; exits 1 if the handler tried I/O that bypasses ctx.
    """

    report = replayq.fork(
        env.app(app_spec),
        job_id,
        from_step=from_step,
        attempt=attempt,
        version=version,
        handler=handler_spec,
        overrides=_parse_assignments(overrides, "--override"),
        stubs=_parse_assignments(stubs, "--stub"),
        allow_io=allow_io,
    )
    _print_report(report, as_json)
    if not as_json:
        click.echo(f"  compare: replayq diff {job_id} {report.trace_id}")
    sys.exit(1 if report.unrecorded_io else 0)


@click.command("diff")
@click.argument("original")
@click.argument("other")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def diff_command(env: Env, original: str, other: str, as_json: bool) -> None:
    """Compare two traces (job ids or trace ids): state, decisions, effects, outcome."""

    result = replayq.diff_traces(env.app(), original, other)
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(replayq.render_diff(result))


@click.command()
@click.argument("job_id", type=JobId, required=False)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--allow-effects", default="", help="Comma-separated effect kinds that may run.")
@click.option("--rate", default=None, help="Bulk reruns per second, e.g. 5/s")
@click.option("--type", "job_type", default=None, help="Bulk: jobs of this type...")
@click.option("--state", "job_state", default=None, help="...in this state...")
@click.option("--since", default=None, help="...finished within this long, e.g. 1h")
@click.option("--yes", is_flag=True, help="Confirm: this touches the real world.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rerun(
    env: Env,
    job_id: int | None,
    app_spec: str,
    allow_effects: str,
    rate: str | None,
    job_type: str | None,
    job_state: str | None,
    since: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Re-execute for real, only the named effect kinds running (guarded, never default)."""

    kinds = [k for k in allow_effects.split(",") if k]
    if not kinds:
        raise click.UsageError("refusing: name the effect kinds that may run (--allow-effects)")
    if not yes:
        raise click.UsageError("refusing: a rerun touches the real world; confirm with --yes")
    app = env.app(app_spec)
    if job_id is not None:
        ids = [job_id]
    elif job_type and job_state:
        cutoff = app.clock.now() - replayq.parse_duration(since) if since else None
        ids = [
            j.id
            for j in app.list_jobs(states=[job_state], job_type=job_type, limit=10_000)
            if cutoff is None or (j.finished_at or j.created_at) >= cutoff
        ]
    else:
        raise click.UsageError("give a JOB_ID, or --type and --state for a bulk rerun")
    per_second = float(rate.removesuffix("/s")) if rate else None
    from rich.progress import Progress

    # A bar for a bulk rerun (it can run for minutes under --rate); never on --json.
    with Progress(disable=as_json or job_id is not None) as bar:
        task = bar.add_task("rerun", total=len(ids))
        reports = replayq.rerun_many(
            app,
            ids,
            allow_effects=kinds,
            rate=per_second,
            progress=lambda n: bar.advance(task, n),
        )
    if as_json:
        emit_json([r.to_dict() for r in reports])
        return
    for r in reports:
        click.echo(
            f"job {r.job_id}: {render.outcome_text(r.outcome)} (trace {r.trace_id}); "
            f"allowed={r.allowed} substituted={r.substituted} refused={r.refused}"
        )


@click.command()
@click.argument("job_id", type=JobId)
@click.option("--simulate", is_flag=True, help="Show what would change; write nothing.")
@click.option("--force", is_flag=True, help="Restore even if later jobs wrote the entities.")
@click.option("--compensate", is_flag=True, help="Also run registered effect compensators.")
@click.option("--attempt", type=int, default=None, help="Undo only this attempt's writes.")
@click.option("--app", "app_spec", default=None, help="module:app (for compensators).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rollback(
    env: Env,
    job_id: int,
    simulate: bool,
    force: bool,
    compensate: bool,
    attempt: int | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Restore the entities a job wrote to their versions before it (as new versions)."""

    app = env.app(app_spec)
    plan = replayq.rollback(app, job_id, simulate=simulate, force=force, attempt=attempt)
    if compensate and not simulate:
        plan.compensated = replayq.compensate(app, job_id, attempt=attempt)
    if as_json:
        emit_json(plan.to_dict())
        return
    verb = "would restore" if simulate else "restored"
    if not plan.changes:
        which = f"job {job_id}" + (f" attempt {attempt}" if attempt is not None else "")
        click.echo(f"{which} wrote no entities; nothing to roll back")
    for change in plan.changes:
        target = f"v{change.restore_version}" if change.restore_version else "(absent)"
        click.echo(
            f"{verb} {change.resource}: v{change.current_version} {change.current_data!r} "
            f"-> {target} {change.restored_data!r}"
        )
        if change.later_writers:
            click.echo(f"  later writers: jobs {change.later_writers}")
    for key in plan.compensated:
        click.echo(f"compensated effect {key}")
