"""The shop's external services, as real HTTP servers on 127.0.0.1 (stdlib only).

Run one per process; it binds a free port, prints ``READY <port>`` on stdout
and serves until terminated::

    python -m replayq.demo.shop.services warehouse

* ``warehouse``: ``POST /shipments {"order_id", "key"}`` creates a shipment
  (``{"id": "shp-N", ...}``). Its latency can be raised while it runs:
  ``POST /_latency {"seconds": 3.0}`` (applies to requests that arrive after).
* ``payment``: ``POST /charges {"order_id", "amount_cents", "key"}`` captures.
* ``email``: ``POST /emails {"to", "subject", "order_id", "key"}`` sends.

Each counts what it received: ``GET /_counts`` returns ``requests`` (every
business request that arrived), ``created`` (resources made), ``by_order``
(resources made per order id), ``in_flight`` and ``latency``. The service does
not deduplicate on ``key``: like many real gateways, it trusts the caller.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROUTES = {
    "warehouse": ("/shipments", "shp"),
    "payment": ("/charges", "ch"),
    "email": ("/emails", "em"),
}


class Ledger:
    """What one service received and made; shared by its request threads."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lock = threading.Lock()
        self.requests = 0
        self.created = 0
        self.in_flight = 0
        self.latency = 0.0
        self.by_order: Counter[str] = Counter()
        self.made: list[dict[str, Any]] = []

    def counts(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests,
                "created": self.created,
                "in_flight": self.in_flight,
                "latency": self.latency,
                "by_order": dict(self.by_order),
                "made": list(self.made),
            }


def make_handler(kind: str, ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    path, _ = ROUTES[kind]

    class Handler(BaseHTTPRequestHandler):
        server_version = f"shop-{kind}/1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the demo prints what matters from /_counts."""

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            data = json.loads(self.rfile.read(length) or b"{}") if length else {}
            return data if isinstance(data, dict) else {}

        def do_GET(self) -> None:
            if self.path == "/_counts":
                self._reply(200, ledger.counts())
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            if self.path == "/_latency":
                seconds = float(self._body().get("seconds", 0.0))
                with ledger.lock:
                    ledger.latency = seconds
                self._reply(200, {"latency": seconds})
                return
            if self.path != path:
                self._reply(404, {"error": f"no route {self.path}"})
                return
            body = self._body()
            with ledger.lock:
                ledger.requests += 1
                ledger.in_flight += 1
                delay = ledger.latency
            try:
                time.sleep(delay)
                with ledger.lock:
                    ledger.created += 1
                    made = {
                        "id": f"{ledger.prefix}-{ledger.created}",
                        "order_id": body.get("order_id"),
                        "key": body.get("key"),
                        "took": delay,
                    }
                    ledger.by_order[str(body.get("order_id"))] += 1
                    ledger.made.append(made)
            finally:
                with ledger.lock:
                    ledger.in_flight -= 1
            self._reply(201, made)

    return Handler


def serve(kind: str) -> None:
    """Serve ``kind`` on a free port of 127.0.0.1 until terminated."""
    if kind not in ROUTES:
        raise SystemExit(f"unknown service {kind!r}; choose one of {', '.join(ROUTES)}")
    ledger = Ledger(ROUTES[kind][1])
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(kind, ledger))
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "")
