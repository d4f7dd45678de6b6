"""``replayq metrics serve``: the fleet's gauges, read from the database at each scrape."""

from __future__ import annotations

import contextlib
import threading

import click

import replayq
from replayq.cli.env import Env, log_options, pass_env


@click.group()
def metrics() -> None:
    """Prometheus metrics (a worker's own: ``replayq worker --metrics-port``)."""


@metrics.command("serve")
@click.option("--port", default=9465, show_default=True, help="Port to serve /metrics on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@log_options
@pass_env
def serve(env: Env, port: int, host: str, log_level: str, log_format: str) -> None:
    """Serve backlog, oldest age, in-flight, dead, outbox lag, locks, in-doubt effects."""
    replayq.configure_logging(log_level, log_format)
    registry = replayq.fleet_registry(env.app())
    replayq.serve_metrics(registry, port, host)
    click.echo(f"serving fleet metrics on http://{host}:{port}/metrics", err=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it stops
        threading.Event().wait()
