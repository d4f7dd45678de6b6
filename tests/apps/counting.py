"""The chaos jobs' door to the counting HTTP server of ``tests/services.py``.

Standard library only: worker processes import it, and ``tests/services.py`` (which
imports pytest for its fixtures) would cost each of them a third of a second of CPU.
"""

from __future__ import annotations

import os
import urllib.request

SERVICE_ENV = "REPLAYQ_TEST_SERVICE"  # as in tests/services.py


def count_effect(key: str) -> None:
    """A chaos job's real effect: ``POST /effects/<key>`` to the service named by
    ``$REPLAYQ_TEST_SERVICE``, where the checker counts it (nothing when it is unset)."""
    base = os.environ.get(SERVICE_ENV)
    if not base:
        return
    request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 or a relay only)
        f"{base}/effects/{key}",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5.0) as response:  # noqa: S310
        response.read()
