"""What every chapter of the demo's story shares: the run, the app, the shop module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq
from replayq import App
from replayq.demo.harness import Demo, DemoResult


def all_settled(app: App) -> bool:
    return not app.list_jobs(states=["queued", "running"], limit=1)


def job_events(app: App, job_id: int, name: str) -> list[replayq.TraceEvent]:
    return [e for e in app.trace(job_id) if e.name == name]


def entry_status(entry: tuple[Any, int | None] | None) -> str:
    if entry is None:
        return "(no entry)"
    value, version = entry
    return f"{value.get('status') if isinstance(value, dict) else value!r} @v{version}"


class Chapter:
    """The state a chapter reads and writes; ``Story.__init__`` sets it."""

    demo: Demo
    say: Callable[..., None]
    result: DemoResult
    shop: Any
    app: App
    job_id: int
