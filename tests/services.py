"""A real external service for replay tests: an HTTP server in its own process, counting requests.

Run as ``python tests/services.py``: it binds 127.0.0.1 on a free port chosen by
the kernel, prints ``READY <port>`` and serves until killed. Every request is
counted by path (``GET /_counts`` shows the counts; control paths under ``/_``
are not counted). Paths the test apps use:

* ``GET /fraud/<order_id>`` — a read only v3 of the test app makes;
* ``GET /inventory/<sku>`` — a read: ``{"sku": ..., "available": N}`` (N from
  ``/_stock``, default 10);
* ``POST /warehouse/shipments`` — a write: ``{"shipment_id": "shp-<n>"}``;
* ``POST /warehouse/cancellations`` — a write (a compensator's undo);
* ``POST /effects/<key>`` — a real effect of the chaos suite, counted per key
  (``tests/chaos_check.py`` reads the counts);
* ``POST /email`` — the email sink: keeps each message (``GET /_mail``);
* ``POST /_fail`` ``{"path": ..., "times": N, "status": 503}`` — the next N
  requests to that path answer ``status`` (default 503; and are counted: they
  reached the network);
* ``POST /_reset`` — forget everything counted, kept and set so far.

``running_service`` (the ``service`` fixture) starts it, waits until it answers,
and kills it afterwards. ``effects_service`` hands the chaos tests one server per
session, reset before each test (a start costs about a second on a loaded machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

READY_TIMEOUT = 10.0
# Also in tests/apps/counting.py: this file runs as a script, where ``tests`` is no package.
SERVICE_ENV = "REPLAYQ_TEST_SERVICE"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.failure_status: dict[str, int] = {}
        self.stock: dict[str, int] = {}
        self.mail: list[Any] = []
        self.shipments = 0


STATE = _State()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read /_counts
        return

    def _reply(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _count(self, path: str) -> bool:
        """Count a request; ``False`` (after answering the failure) when told to fail."""
        with STATE.lock:
            STATE.counts[path] += 1
            if STATE.failures[path] > 0:
                STATE.failures[path] -= 1
                status = STATE.failure_status.get(path, 503)
                self._reply(status, {"error": f"told to fail with {status}"})
                return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/_counts":
            with STATE.lock:
                self._reply(200, dict(STATE.counts))
            return
        if path == "/_mail":
            with STATE.lock:
                self._reply(200, list(STATE.mail))
            return
        if not self._count(path):
            return
        if path.startswith("/fraud/"):
            self._reply(200, {"score": 0.1})
            return
        if path.startswith("/inventory/"):
            sku = path.removeprefix("/inventory/")
            with STATE.lock:
                available = STATE.stock.get(sku, 10)
            self._reply(200, {"sku": sku, "available": available})
            return
        self._reply(404, {"error": f"no such path {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._body()
        if path == "/_fail":
            with STATE.lock:
                STATE.failures[body["path"]] += int(body.get("times", 1))
                STATE.failure_status[body["path"]] = int(body.get("status", 503))
            self._reply(200, {"ok": True})
            return
        if path == "/_reset":
            with STATE.lock:
                STATE.reset()
            self._reply(200, {"ok": True})
            return
        if path == "/_stock":
            with STATE.lock:
                STATE.stock[body["sku"]] = int(body["available"])
            self._reply(200, {"ok": True})
            return
        if not self._count(path):
            return
        if path == "/warehouse/shipments":
            with STATE.lock:
                STATE.shipments += 1
                number = STATE.shipments
            self._reply(200, {"shipment_id": f"shp-{number}", "order_id": body.get("order_id")})
            return
        if path == "/warehouse/cancellations":
            self._reply(200, {"cancelled": body.get("shipment_id")})
            return
        if path.startswith("/effects/"):  # the chaos suite's effects: counted per key
            self._reply(200, {"ok": True})
            return
        if path == "/email":
            with STATE.lock:
                STATE.mail.append(body)
                number = len(STATE.mail)
            self._reply(200, {"message_id": f"msg-{number}"})
            return
        self._reply(404, {"error": f"no such path {path}"})


def serve() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


# -- the client side: used by the fixture and by test handlers -----------------------------------


def request(method: str, url: str, body: Any = None, *, timeout: float = 5.0) -> Any:
    """One JSON request with urllib; ``urllib.error.HTTPError`` on a non-2xx answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only)
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read() or b"null")


@dataclass
class Service:
    """A running service process: its base URL and what it has counted."""

    base_url: str
    proc: subprocess.Popen[str]

    def counts(self) -> dict[str, int]:
        """Requests per path so far (control paths excluded)."""
        counted = request("GET", f"{self.base_url}/_counts")
        assert isinstance(counted, dict)
        return counted

    def total(self) -> int:
        return sum(self.counts().values())

    def mail(self) -> list[Any]:
        received = request("GET", f"{self.base_url}/_mail")
        assert isinstance(received, list)
        return received

    def fail_next(self, path: str, times: int = 1, status: int = 503) -> None:
        request("POST", f"{self.base_url}/_fail", {"path": path, "times": times, "status": status})

    def set_stock(self, sku: str, available: int) -> None:
        request("POST", f"{self.base_url}/_stock", {"sku": sku, "available": available})


@contextmanager
def running_service() -> Iterator[Service]:
    """Start the server as a subprocess, wait until it answers, kill it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints READY <port> once it is bound
        if not line.startswith("READY "):
            raise AssertionError(f"the test service did not start: {line!r}")
        service = Service(f"http://127.0.0.1:{int(line.split()[1])}", proc)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                service.counts()
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield service
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    """The running service; ``$REPLAYQ_TEST_SERVICE`` tells test handlers (and CLI
    subprocesses, which inherit it) where it is."""
    with running_service() as running:
        monkeypatch.setenv(SERVICE_ENV, running.base_url)
        yield running


@pytest.fixture(scope="session")
def _session_service() -> Iterator[Service]:
    with running_service() as running:
        yield running


@pytest.fixture
def effects_service(
    _session_service: Service, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Service]:
    """The counting server, shared by the session and reset for this test: the chaos
    tests' effects (``count_effect``) are counted from zero. Set in
    ``$REPLAYQ_TEST_SERVICE`` as ``service`` does."""
    request("POST", f"{_session_service.base_url}/_reset", {})
    monkeypatch.setenv(SERVICE_ENV, _session_service.base_url)
    yield _session_service


if __name__ == "__main__":
    serve()
