"""``replayq trace``: a job's timeline, a resource's timeline across workers, exported cases."""

from __future__ import annotations

import json

import click

import replayq
from replayq.cli import render
from replayq.cli.env import Env, JobId, emit_json, pass_env


@click.group("trace")
def trace_group() -> None:
    """Read traces."""


@trace_group.command("show")
@click.argument("job_id", type=JobId)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def trace_show(env: Env, job_id: int, as_json: bool) -> None:
    """A job's timeline: every attempt, decision and transition."""
    app = env.app()
    job = app.get_job(job_id)
    events = app.trace(job_id)
    if as_json:
        emit_json([vars(e) for e in events])
    else:
        otel = replayq.otel_trace_id(job.trace_context)
        if otel:
            click.echo(f"OpenTelemetry trace {otel}")
        click.echo(render.timeline(events))


@trace_group.command("resource")
@click.argument("resource")
@click.option(
    "--leases", is_flag=True, help="Also show the lease transitions of the jobs that touched it."
)
@click.option("--all-origins", is_flag=True, help="Include replay, fork and rerun traces.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="module:attribute of your replayq.App: its redaction rules find the resource too.",
)
@pass_env
def trace_resource(
    env: Env, resource: str, leases: bool, all_origins: bool, as_json: bool, app_spec: str | None
) -> None:
    """Every event on one resource (and its versioned keys) across jobs and workers, in
    happens-before order; production traces only unless --all-origins.

    A trace stores a resource redacted (an entity keyed by a card number is
    card:[redacted:…]): RESOURCE is redacted the same way before it is looked up, by the
    built-in rules and $REPLAYQ_REDACTION_KEY, and with --app by the app's and its job
    types' rules, so the id as the application knows it finds its events."""
    events = env.app(app_spec).resource_trace(resource, leases=leases, all_origins=all_origins)
    if as_json:
        emit_json([vars(e) for e in events])
    else:
        click.echo(render.timeline(events, show_job=True))


@trace_group.command("export")
@click.argument("job_id", type=JobId)
@click.option("--attempt", type=int, default=None, help="Which attempt (default: the last).")
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option(
    "--no-keep",
    is_flag=True,
    help="Do not pin the job against gc (by default an exported job is kept).",
)
@pass_env
def trace_export(env: Env, job_id: int, attempt: int | None, app_spec: str, no_keep: bool) -> None:
    """Write a self-contained regression case (JSON) for replayq.testing.

    The job is pinned (``replayq keep``) so gc never collects the recording the case
    came from; ``--no-keep`` leaves it to its retention.
    """
    app = env.app(app_spec)
    case = replayq.export_case(app, job_id, attempt)
    if not no_keep:
        app.keep(job_id, "exported as a regression case")
    click.echo(json.dumps(case, indent=1))
