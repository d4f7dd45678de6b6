"""The ``replayq`` command line: a thin layer over the public Python API.

One module per command group: ``jobs`` (worker, enqueue, jobs, dead, stats,
signals), ``trace``, ``replay`` (replay, fork, diff, rerun, rollback) and
``admin`` (db, contract, locks, outbox, state, demo) and ``rollout``. Each imports only the
public ``replayq`` package; a new command goes in its group's module and is
registered here.
"""

from __future__ import annotations

from typing import Any

import click

from replayq import ReplayqError, __version__
from replayq.cli import admin, effects, jobs, metrics, replay, rollout, trace, web
from replayq.cli.env import Env


class Cli(click.Group):
    """Turns replayq errors into one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayqError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=Cli)
@click.version_option(__version__, prog_name="replayq")
@click.option(
    "--db",
    envvar="REPLAYQ_DB",
    help="Database URL; beats $REPLAYQ_DB, which beats the URL in the --app module's App(...).",
)
@click.pass_context
def main(ctx: click.Context, db: str | None) -> None:
    """replayq: a job queue whose executions can be traced, replayed, forked and reversed."""
    ctx.obj = Env(db)


main.add_command(jobs.worker)
main.add_command(jobs.enqueue)
main.add_command(jobs.jobs)
main.add_command(jobs.dead)
main.add_command(effects.effects)
main.add_command(jobs.stats)
main.add_command(jobs.signals)
main.add_command(metrics.metrics)
main.add_command(web.web)
main.add_command(trace.trace_group)
main.add_command(admin.db)
main.add_command(admin.contract)
main.add_command(admin.locks)
main.add_command(admin.outbox)
main.add_command(admin.state)
main.add_command(admin.demo_command)
main.add_command(replay.replay)
main.add_command(replay.fork_command)
main.add_command(replay.diff_command)
main.add_command(replay.rerun)
main.add_command(replay.rollback)
main.add_command(rollout.rollout)
