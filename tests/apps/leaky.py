"""Handlers that reach the world without going through ``ctx``: what the replay seal is for.

* ``leaky_http`` reads stock with ``urllib`` directly in step ``charge``;
* ``leaky_subprocess`` runs ``touch MARKER`` in step ``notify``;
* ``leaky_file`` writes ``PATH`` in step ``write``.

Live, each does its I/O for real. A dry-run, fork or ``assert_replays`` must
refuse it, report it, and leave the world as it was.
"""

from __future__ import annotations

import os
import subprocess

import replayq
from tests.services import SERVICE_ENV, request

ONE_ATTEMPT = replayq.Retry(max_attempts=1)


def declare(app: replayq.App) -> replayq.App:
    @app.job("leaky_http", retry=ONE_ATTEMPT)
    def leaky_http(ctx: replayq.Context, sku: str) -> dict[str, object]:
        with ctx.step("load"):
            started = ctx.now()
        with ctx.step("charge"):
            stock = request("GET", f"{os.environ[SERVICE_ENV]}/inventory/{sku}")
        return {"started": started, "stock": stock}

    @app.job("leaky_subprocess", retry=ONE_ATTEMPT)
    def leaky_subprocess(ctx: replayq.Context, marker: str) -> None:
        with ctx.step("load"):
            ctx.now()
        with ctx.step("notify"):
            subprocess.run(["touch", marker], check=True)

    @app.job("leaky_file", retry=ONE_ATTEMPT)
    def leaky_file(ctx: replayq.Context, path: str) -> None:
        with ctx.step("load"):
            ctx.now()
        with ctx.step("write"), open(path, "a", encoding="utf-8") as out:
            out.write("written\n")

    return app


app = declare(replayq.App())
