"""Signing in returns to the page the link named, and only to a page of this dashboard.

``/login?next=…`` is a link anyone can send. A ``next`` that a browser reads as
another site (``//host``, ``/\\host``, a tab or newline inside ``//``, a scheme) keeps
the browser on the dashboard (its overview, or a 404 of its own: the redirect quotes a
backslash), in a real headless Chromium; a local page is returned to as named.
"""

from __future__ import annotations

import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps import dashboard_shop
from tests.browser.conftest import TOKEN, Dashboard, start_dashboard


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """Another site on this machine (``127.0.0.1:PORT``) that a redirect could lead to."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"elsewhere")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_signing_in_never_leads_off_the_dashboard(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path, elsewhere: str
) -> None:
    app = dashboard_shop.declare(app_factory())
    app.list_jobs()  # the schema, before the dashboard opens the database
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    targets = [
        f"//{elsewhere}/",
        f"/\\{elsewhere}/",
        f"/\\/{elsewhere}/",
        f"/\t/{elsewhere}/",
        f"/\n/{elsewhere}/",
        f"http://{elsewhere}/",
    ]
    for target in [*targets, "/dead"]:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{web.url}/login?next={urllib.parse.quote(target, safe='')}")
        page.fill("input[name=token]", TOKEN)
        with page.expect_navigation():
            page.click("button:has-text('Sign in')")
        landed = urllib.parse.urlsplit(page.url)
        assert f"{landed.scheme}://{landed.netloc}" == web.url, repr(target)
        if target == "/dead":
            assert landed.path == "/dead"
        context.close()
