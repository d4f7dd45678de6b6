"""``replayq trace show JOB`` names the OpenTelemetry trace the job was enqueued in.

A real ``replayq`` process reads the job row an enqueue wrote under an active span.
A job enqueued outside any span has no such line.
"""

from __future__ import annotations

import subprocess
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tests.acceptance.workers import REPLAYQ, ROOT


def show(url: str, job_id: int) -> str:
    done = subprocess.run(
        [REPLAYQ, "--db", url, "trace", "show", str(job_id)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_trace_show_prints_the_opentelemetry_trace_of_the_enqueue(app_factory: Any) -> None:
    app = app_factory()

    @app.job("ship")
    def ship(ctx: Any, order_id: int) -> int:
        return order_id

    with TracerProvider().get_tracer("shop").start_as_current_span("POST /orders") as request:
        traced = app.enqueue("ship", {"order_id": 1})
    untraced = app.enqueue("ship", {"order_id": 2})
    trace_id = format(request.get_span_context().trace_id, "032x")

    assert show(app.url, traced).splitlines()[0] == f"OpenTelemetry trace {trace_id}"
    assert "OpenTelemetry" not in show(app.url, untraced)
