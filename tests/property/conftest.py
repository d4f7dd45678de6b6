"""Hypothesis settings for the property tests.

Two profiles: ``ci`` (the default; few examples, no deadline: the machine is
shared and slow) and ``deep`` (``HYPOTHESIS_PROFILE=deep``: many more examples,
for a local hunt). No example database is written into the work tree.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

_COMMON: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow],
}
settings.register_profile("ci", max_examples=60, **_COMMON)
settings.register_profile("deep", max_examples=2000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
