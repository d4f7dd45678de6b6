"""A real dashboard process and a real headless Chromium (Debian's ``chromium``).

Playwright drives the system browser through ``executable_path``; nothing is
downloaded (``playwright install`` is never run). ``.ci/run`` installs the
``chromium`` package when it is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.workers import REPLAYQ, ROOT, wait_for
from tests.conftest import missing

TOKEN = "correct-horse-battery-staple"


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    missing("no chromium on PATH", install="apt-get install -y chromium")


# Module scope, not session: while sync_playwright is open the main thread has a running
# event loop, and every later test's asyncio.run() raised "cannot be called from a running
# event loop" (test_seal, the async enqueue tests) when the browser tests ran first.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing(f"playwright is not installed: {exc}", install="pip install -r requirements.lock")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@dataclass
class Dashboard:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_dashboard(
    db_url: str,
    tmp_path: Path,
    *,
    token: str | None,
    app_spec: str = "tests.apps.dashboard_shop:app",
) -> Dashboard:
    port = free_port()
    log = tmp_path / f"web-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_WEB_TOKEN"}
    if token:
        env["REPLAYQ_WEB_TOKEN"] = token
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    argv = [
        REPLAYQ,
        "--db",
        db_url,
        "web",
        "--port",
        str(port),
        "--app",
        app_spec,
    ]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    dashboard = Dashboard(f"http://127.0.0.1:{port}", proc, log)

    def up() -> bool:
        try:
            with urllib.request.urlopen(dashboard.url + "/", timeout=2):  # noqa: S310 -- http://127.0.0.1 only
                return True
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"the dashboard exited:\n{dashboard.output()}") from None
            return False

    wait_for(up, timeout=30, what="the dashboard to answer")
    return dashboard


@pytest.fixture
def dashboards(tmp_path: Path) -> Iterator[list[Dashboard]]:
    started: list[Dashboard] = []
    yield started
    for dashboard in started:
        dashboard.proc.terminate()
        try:
            dashboard.proc.wait(10)
        except subprocess.TimeoutExpired:
            dashboard.proc.kill()
            dashboard.proc.wait(10)
        print(f"--- dashboard {dashboard.url} ---\n{dashboard.output()}")
