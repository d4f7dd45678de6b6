"""What every command shares: the database URL, the user's app, JSON output."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from typing import Any

import click

import replayq
from replayq import App

DEFAULT_DB_FILE = "replayq.db"

# Job, attempt and trace ids are SQLite / PostgreSQL BIGINTs: a larger number is a typo.
JobId = click.IntRange(1, 2**63 - 1)


class Env:
    """What the root command collected: the database URL and, if given, the user's app."""

    def __init__(self, db: str | None, *, debug: bool = False) -> None:
        self.db = db
        self.debug = debug
        self._app: App | None = None

    def app(self, spec: str | None = None) -> App:
        if self._app is None:
            app = load_app(spec) if spec else App(self.db)
            if spec and self.db:
                app = app.on_database(self.db)
            _announce_default_database(app)
            _redact_stray_log_lines(app)
            self._app = app
        return self._app

    def close(self) -> None:
        """Close the app's connections as the command ends (the root context's close).

        A process that exits with a SQLite connection still open leaves its WAL behind
        (up to ``wal_autocheckpoint``, ~16 MB): the next process to open the file reads
        all of it back (recovery) and copies it into the database at its first
        checkpoint. At exit the interpreter does not close them itself (``gc.freeze``
        keeps the objects alive, and some are held by threads). Closed here, the last
        connection checkpoints the WAL and removes it, as SQLite does on a clean close.
        """
        if self._app is not None:
            self._app.close()


def _redact_stray_log_lines(app: App) -> None:
    """Log lines of a command that runs the app's handlers (a dry-run, a fork, a rerun)
    go to stderr redacted with the app's rules, as a worker's do. Without a handler on
    the root logger (none configured by the command or the app's module), Python's last
    resort printed a handler's warnings as they were: the token a replayed handler read
    from its environment again, in clear. Nothing changes where one is configured."""
    if not logging.getLogger().handlers:
        replayq.configure_logging("warning", "text", redact=app.runtime.redactor_for)


def _announce_default_database(app: App) -> None:
    """Name the default database on stderr, once: when this command is about to create it."""
    if app.url == f"sqlite:///{DEFAULT_DB_FILE}" and not os.path.exists(DEFAULT_DB_FILE):
        click.echo(
            f"replayq: no --db or $REPLAYQ_DB given; creating the SQLite database "
            f"{os.path.abspath(DEFAULT_DB_FILE)}",
            err=True,
        )


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the ``App`` it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r}: use module:attribute, e.g. shop.jobs:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r} (from {spec!r}): {exc}", param_hint="--app"
        ) from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is not a replayq.App")
    return app


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


pass_env = click.make_pass_decorator(Env)


def log_options(command: Any) -> Any:
    """``--log-level`` and ``--log-format`` for a long-running command (worker, web, metrics)."""
    command = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="json: one object per line, with job_id, trace_id, attempt, version, worker_id.",
    )(command)
    return click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
        help="The least severe log records shown.",
    )(command)
