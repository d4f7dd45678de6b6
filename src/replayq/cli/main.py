"""The ``replayq`` command line: a thin layer over the public Python API.

One module per command group: ``jobs`` (worker, enqueue, jobs, dead, stats,
signals; its bulk actions in ``bulk``), ``schedules``, ``events``, ``trace``,
``replay`` (replay, fork, diff, rerun, rollback), ``admin`` (db, contract,
locks, outbox, state, demo) and ``rollout``. Each imports only the public
``replayq`` package; a new command goes in its group's module and is registered here.

Every command, ``worker`` first, pays at start for what these modules import, so a
command imports what only it needs (``rich``'s bars, the web server, the demo) in
its own body, and ``replayq``'s replay and rollout names load on first use.

Exit codes (docs/reliability.md), one table for every command:

====  ==========================================================================
code  meaning
====  ==========================================================================
0     done
1     findings: a replay diverged, a check found drift, a seal refused I/O
2     usage: a bad option or input, or a job, trace or fork that does not exist
3     storage unavailable: the database cannot be reached or take writes for now
      (locked, full, read-only, down); trying again later may work
4     internal error: a bug in replayq (``--debug`` shows the traceback to report)
====  ==========================================================================

Every error is one line on stderr, ``error: …``, with any password in a
database URL masked; ``--debug`` (or ``REPLAYQ_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, NoReturn

import click

import replayq
from replayq import DatabaseUnavailableError, ReplayqError
from replayq.cli import (
    admin,
    effects,
    events,
    jobs,
    metrics,
    replay,
    retention,
    rollout,
    schedules,
    trace,
    web,
)
from replayq.cli.env import Env
from replayq.redaction import mask_url_passwords

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4


def _fail(ctx: click.Context, exc: BaseException, message: str, code: int) -> NoReturn:
    if ctx.obj is not None and getattr(ctx.obj, "debug", False):
        traceback.print_exception(exc, file=sys.stderr)
    # One line: driver messages (psycopg's hints) come on several.
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"error: {mask_url_passwords(line)}", err=True)
    ctx.exit(code)


class Cli(click.Group):
    """The one error handler: each failure is one line on stderr and a code from the table."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DatabaseUnavailableError as exc:
            _fail(ctx, exc, str(exc), EXIT_UNAVAILABLE)
        except ReplayqError as exc:
            _fail(ctx, exc, str(exc), EXIT_USAGE)
        except click.UsageError as exc:
            where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            _fail(ctx, exc, exc.format_message() + where, EXIT_USAGE)
        except click.ClickException as exc:
            # A command's own refusal (no such contract or lock, a job in the wrong
            # state, a missing extra): the user's input, one line, the usage code.
            _fail(ctx, exc, exc.format_message(), EXIT_USAGE)
        except (click.exceptions.Exit, click.Abort):
            raise
        # The last line of defence: a bug is one line too, with --debug for the traceback.
        except Exception as exc:
            _fail(
                ctx,
                exc,
                f"internal error (a bug in replayq): {type(exc).__name__}: {exc}; "
                "rerun with --debug for the traceback",
                EXIT_INTERNAL,
            )


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    # Not click.version_option(replayq.__version__): importing importlib.metadata (email,
    # zipfile, csv under it) cost every command's start, and only --version needs it.
    if value and not ctx.resilient_parsing:
        click.echo(f"replayq, version {replayq.__version__}")
        ctx.exit()


@click.group(cls=Cli)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option(
    "--db",
    envvar="REPLAYQ_DB",
    help="Database URL; beats $REPLAYQ_DB, which beats the URL in the --app module's App(...).",
)
@click.option(
    "--debug",
    is_flag=True,
    envvar="REPLAYQ_DEBUG",
    help="On an error, print the traceback too.",
)
@click.pass_context
def main(ctx: click.Context, db: str | None, debug: bool) -> None:
    """replayq: a job queue whose executions can be traced, replayed, forked and reversed.

    Exit codes: 0 done, 1 findings (diverged, drift), 2 usage or not found,
    3 storage unavailable, 4 internal error.
    """
    ctx.obj = Env(db, debug=debug)
    if db is not None and "://" not in db:
        raise click.BadParameter(
            f"{db!r} is not a database URL; use sqlite:///path/to/file.db or "
            "postgresql://user@host/name",
            param_hint="--db",
        )


main.add_command(jobs.worker)
main.add_command(jobs.enqueue)
main.add_command(jobs.jobs)
main.add_command(jobs.dead)
main.add_command(effects.effects)
main.add_command(jobs.stats)
main.add_command(jobs.signals)
main.add_command(schedules.schedules)
main.add_command(events.events)
main.add_command(metrics.metrics)
main.add_command(web.web)
main.add_command(trace.trace_group)
main.add_command(admin.db)
main.add_command(admin.contract)
main.add_command(admin.locks)
main.add_command(admin.outbox)
main.add_command(admin.state)
main.add_command(admin.demo_command)
main.add_command(retention.gc)
main.add_command(retention.keep)
main.add_command(replay.replay)
main.add_command(replay.fork_command)
main.add_command(replay.diff_command)
main.add_command(replay.rerun)
main.add_command(replay.rollback)
main.add_command(rollout.rollout)
