"""``replayq web``: the dashboard (needs ``replayq[web]``)."""

from __future__ import annotations

import os

import click

import replayq
from replayq.cli.env import Env, log_options, pass_env


@click.command("web")
@click.option("--port", default=8080, show_default=True, help="Port to serve the dashboard on.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback exposes the dashboard to the network.",
)
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="module:attribute of your replayq.App (dry-run and fork need the handlers).",
)
@log_options
@pass_env
def web(
    env: Env, port: int, host: str, app_spec: str | None, log_level: str, log_format: str
) -> None:
    """Serve the dashboard. Actions need $REPLAYQ_WEB_TOKEN; without it, read-only."""
    replayq.configure_logging(log_level, log_format)
    try:
        import uvicorn

        from replayq.web.server import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra: pip install 'replayq[web]' ({exc})"
        ) from exc
    token = os.environ.get("REPLAYQ_WEB_TOKEN") or None
    dashboard = create_app(env.app(app_spec), token=token)
    mode = "actions need the token" if token else "read-only (REPLAYQ_WEB_TOKEN is not set)"
    click.echo(f"dashboard on http://{host}:{port}/ - {mode}", err=True)
    uvicorn.run(dashboard, host=host, port=port, log_config=None, access_log=False)
