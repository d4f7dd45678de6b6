"""A job that writes down every module its worker process has imported by then.

What a plain job's worker loads is what every worker pays for at start: the test of
``tests/acceptance/test_light_start.py`` reads the list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import replayq


def report_modules(ctx: replayq.Context, path: str) -> None:
    """Write the sorted names of ``sys.modules`` to ``path`` (JSON)."""
    Path(path).write_text(json.dumps(sorted(sys.modules)))


def build(url: str | None = None) -> replayq.App:
    """The app on ``url`` (default: ``--db`` / ``$REPLAYQ_DB``); tests build it to enqueue."""
    built = replayq.App(url)
    built.job("report_modules")(report_modules)
    return built


app = build()
