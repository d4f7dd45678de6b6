"""HTTP clients for the shop's external services; base URLs come from the environment.

``$SHOP_WAREHOUSE_URL``, ``$SHOP_PAYMENT_URL`` and ``$SHOP_EMAIL_URL`` (set by
``replayq demo``, which starts ``replayq.demo.shop.services``). A 5xx reply or an
unreachable service is a ``DependencyError`` (retried by contracts that list
``dependency``); a 4xx reply is a ``ValidationError`` (never retried).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

import replayq


def _base(variable: str) -> str:
    url = os.environ.get(variable)
    if not url:
        raise replayq.ConfigurationError(f"${variable} is not set (the service's base URL)")
    return url.rstrip("/")


def post(variable: str, path: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """POST JSON to the service named by ``$variable``; the JSON reply."""
    request = urllib.request.Request(  # noqa: S310 (the base URL is the operator's http URL)
        _base(variable) + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (as above)
            answer = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise replayq.DependencyError(f"{path}: HTTP {exc.code}") from exc
        raise replayq.ValidationError(f"{path}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, TimeoutError) as exc:
        raise replayq.DependencyError(f"{path}: {exc}") from exc
    if not isinstance(answer, dict):
        raise replayq.DependencyError(f"{path}: the reply is not a JSON object")
    return answer


def create_shipment(order_id: int, key: str, *, timeout: float = 30.0) -> dict[str, Any]:
    return post(
        "SHOP_WAREHOUSE_URL", "/shipments", {"order_id": order_id, "key": key}, timeout=timeout
    )


def capture_payment(order_id: int, amount_cents: int, key: str) -> dict[str, Any]:
    body = {"order_id": order_id, "amount_cents": amount_cents, "key": key}
    return post("SHOP_PAYMENT_URL", "/charges", body, timeout=5.0)


def send_email(order_id: int, to: str, subject: str, key: str) -> dict[str, Any]:
    body = {"order_id": order_id, "to": to, "subject": subject, "key": key}
    return post("SHOP_EMAIL_URL", "/emails", body, timeout=5.0)
