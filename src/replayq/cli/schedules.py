"""``replayq schedules``: the periodic jobs, their last and next slots."""

from __future__ import annotations

import click

from replayq.cli import render
from replayq.cli.env import Env, emit_json, pass_env


@click.group()
def schedules() -> None:
    """Periodic jobs (@app.periodic): what each enqueued last and when it runs next."""


@schedules.command("list")
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="Also show this app's schedules that no worker has stored yet.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def list_schedules(env: Env, app_spec: str | None, as_json: bool) -> None:
    """Each schedule: cron, job type, missed-slot policy, last slot and its job, next slot."""
    statuses = env.app(app_spec).schedule_statuses()
    if as_json:
        emit_json([vars(s) for s in statuses])
        return
    if not statuses:
        click.echo("no schedules (declare one with @app.periodic; a worker stores it)")
        return
    for s in statuses:
        last = (
            f"last {render.date_time(s.last_slot)} -> job {s.last_job_id}"
            if s.last_slot is not None
            else "never enqueued"
        )
        click.echo(
            f"{s.name:<24} {s.cron:<16} {s.job_type:<20} {s.missed:<8} {last}; "
            f"next {render.date_time(s.next_slot)} ({s.timezone})"
        )
