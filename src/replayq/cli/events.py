"""``replayq events``: the events of every job in a time window, in happens-before order."""

from __future__ import annotations

import json

import click

import replayq
from replayq.cli import render
from replayq.cli.bulk import parse_moment
from replayq.cli.env import Env, pass_env


@click.command()
@click.option("--since", default=None, help="From (inclusive): 10m ago, or 2026-11-30T18:00.")
@click.option("--until", default=None, help="To (exclusive), same forms.")
@click.option("--type", "job_type", default=None, help="Only events of jobs of this type.")
@click.option("--name", default=None, help="Only events of this name (e.g. retry.scheduled).")
@click.option("--resource", default=None, help="Only events on resources with this prefix.")
@click.option("--version", default=None, help="Only jobs run by this handler version.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@pass_env
def events(
    env: Env,
    since: str | None,
    until: str | None,
    job_type: str | None,
    name: str | None,
    resource: str | None,
    version: str | None,
    as_json: bool,
) -> None:
    """Stream events across jobs and workers in a window, ordered by the hybrid logical clock."""
    app = env.app()
    now = app.clock.now()
    found = replayq.events_between(
        app,
        since=parse_moment(since, now, "--since"),
        until=parse_moment(until, now, "--until"),
        job_type=job_type,
        name=name,
        resource=resource,
        version=version,
    )
    for item in found:
        if as_json:
            body = {**vars(item.event), "job_type": item.job_type, "version": item.version}
            click.echo(json.dumps(body, sort_keys=True, default=str))
        else:
            click.echo(render.event_line(item.event, show_job=True))
