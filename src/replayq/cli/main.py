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
1     findings: a replay diverged, a check found drift, a seal refused I/O; also a
      verification that selected no attempt (nothing proven: ``rollout verify``'s
      verdict ``empty``); ``contract lint --strict`` with a rule it could not check
2     usage: a bad option or input, or a job, trace or fork that does not exist
3     storage unavailable: the database cannot be reached or take writes for now
      (locked, full, read-only, down); trying again later may work
4     internal error: a bug in replayq (``--debug`` shows the traceback to report)
5     unfinished: what was asked about has no verdict yet (a background verification
      still queued or running); asking again later may give one
141   the output's reader went away (``| head``): the rest is dropped, no message
====  ==========================================================================

Every error is one line on stderr, ``error: …``, with any password in a
database URL masked; ``--debug`` (or ``REPLAYQ_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import select
import sys
import traceback
from typing import Any, NoReturn

import click

import replayq
from replayq import DatabaseUnavailableError, ReplayqError
from replayq.cli import jobs
from replayq.cli.env import Env
from replayq.redaction import mask_url_passwords

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4
# Not 3 (the storage, which later may take writes again) nor 1 (a verdict): nothing has
# failed, and nothing has passed either (``rollout verify-status`` of a queued run).
EXIT_UNFINISHED = 5
# 128 + SIGPIPE: what a shell reports for a command its reader's exit killed (under
# ``set -o pipefail``); not 0, since the command's own outcome (1 on findings) is unknown.
EXIT_READER_GONE = 141


def _fail(ctx: click.Context, exc: BaseException, message: str, code: int) -> NoReturn:
    if ctx.obj is not None and getattr(ctx.obj, "debug", False):
        traceback.print_exception(exc, file=sys.stderr)
    # One line: driver messages (psycopg's hints) come on several.
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"error: {mask_url_passwords(line)}", err=True)
    ctx.exit(code)


# The groups a worker never runs load when their command is run or listed (``--help``):
# importing them all cost every worker's start (issue 13). Each name maps to (module,
# attribute); ``jobs``'s commands, ``worker`` among them, are registered as they are.
LAZY_COMMANDS = {
    "effects": ("replayq.cli.effects", "effects"),
    "schedules": ("replayq.cli.schedules", "schedules"),
    "events": ("replayq.cli.events", "events"),
    "metrics": ("replayq.cli.metrics", "metrics"),
    "web": ("replayq.cli.web", "web"),
    "trace": ("replayq.cli.trace", "trace_group"),
    "db": ("replayq.cli.admin", "db"),
    "contract": ("replayq.cli.admin", "contract"),
    "locks": ("replayq.cli.admin", "locks"),
    "outbox": ("replayq.cli.admin", "outbox"),
    "state": ("replayq.cli.admin", "state"),
    "demo": ("replayq.cli.admin", "demo_command"),
    "gc": ("replayq.cli.retention", "gc"),
    "keep": ("replayq.cli.retention", "keep"),
    "replay": ("replayq.cli.replay", "replay"),
    "fork": ("replayq.cli.replay", "fork_command"),
    "diff": ("replayq.cli.replay", "diff_command"),
    "rerun": ("replayq.cli.replay", "rerun"),
    "rollback": ("replayq.cli.replay", "rollback"),
    "rollout": ("replayq.cli.rollout", "rollout"),
}


class Cli(click.Group):
    """The one error handler: each failure is one line on stderr and a code from the table.

    Also the group that imports a command of ``LAZY_COMMANDS`` when it is first asked for.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

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
        except BrokenPipeError as exc:
            if not _output_reader_gone():
                # Another pipe of the command's broke (a dry-run's worker process that
                # died): a failure like any other, never dropped without a word as 141.
                _internal(ctx, exc)
            # The reader closed the pipe (``replayq contract show T | head``): nothing of
            # replayq's failed. stdout goes to /dev/null so the exit's flush is quiet too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(EXIT_READER_GONE)
        # The last line of defence: a bug is one line too, with --debug for the traceback.
        except Exception as exc:
            _internal(ctx, exc)


def _internal(ctx: click.Context, exc: BaseException) -> NoReturn:
    _fail(
        ctx,
        exc,
        f"internal error (a bug in replayq): {type(exc).__name__}: {exc}; "
        "rerun with --debug for the traceback",
        EXIT_INTERNAL,
    )


def _output_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reading end is closed: ``poll`` reports
    ``POLLERR`` on it then. A ``BrokenPipeError`` of the command's is the reader going away
    only if so; a regular file or a terminal never is."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced (a test's capture) or closed
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


_frozen_at_exit = False


def _freeze_at_exit() -> None:
    """Have the process's exit skip the collector's passes over what is still alive.

    At exit the interpreter clears every module and runs full collections over all the
    objects left: ~60M instructions of a PostgreSQL worker's ~1,000M from start to stop,
    to free memory the process's end frees anyway. ``gc.freeze`` at exit moves them out of
    the collector's reach first. Registered once a process, at its first command; ``atexit``
    runs it after the handlers registered later (the app's, OpenTelemetry's) and before
    ``logging``'s flush, which needs no collection. As ever at exit, an object kept alive
    only by a reference cycle may then never be finalized: Python promises no ``__del__``
    of objects that still exist when the interpreter exits."""
    global _frozen_at_exit
    if not _frozen_at_exit:
        _frozen_at_exit = True
        atexit.register(gc.freeze)


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
    3 storage unavailable, 4 internal error, 5 unfinished (no verdict yet).
    """
    _freeze_at_exit()
    ctx.obj = Env(db, debug=debug)
    ctx.call_on_close(ctx.obj.close)
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
main.add_command(jobs.stats)
main.add_command(jobs.signals)
