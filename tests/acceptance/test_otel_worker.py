"""``replayq worker --otel``: spans leave a real worker through the exporter OTEL_* names.

The worker is configured the way any OpenTelemetry process is: ``OTEL_TRACES_EXPORTER``
picks the SDK's console exporter (its spans go to the worker's stdout, a file here)
and ``OTEL_SERVICE_NAME`` names the service. The job was enqueued inside the
caller's span, so the attempts must be its children; the retry must link to the
first attempt; the effect must be a child of its step, the step of its attempt.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

import replayq
from tests.acceptance.workers import run_cli
from tests.apps import observed


def spans_in(text: str) -> list[dict[str, Any]]:
    """The JSON documents the console exporter printed one after another."""
    decoder = json.JSONDecoder()
    found, index = [], 0
    while (start := text.find("{", index)) != -1:
        span, index = decoder.raw_decode(text, start)
        found.append(span)
    return found


def run_worker(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # --burst-wait: the flaky job's retry is due a few ms after its first attempt fails.
    burst = ("--burst", "--burst-wait", "5")
    worker = ("worker", "--app", "tests.apps.observed:app", *burst, "--otel")
    return run_cli(url, *worker, env=env, unset=("OTEL_",), timeout=90)


def test_worker_otel_exports_attempt_spans_with_parent_links_and_children(
    sqlite_url: str, tmp_path: Path
) -> None:
    app = observed.declare(replayq.App(sqlite_url, auto_migrate=True))
    with TracerProvider().get_tracer("shop").start_as_current_span("checkout") as checkout:
        flaky = app.enqueue("flaky", {"n": 1})
        notify = app.enqueue("notify", {"order_id": 7})
    app.close()
    caller = checkout.get_span_context()

    done = run_worker(
        sqlite_url,
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "shop-worker"},
    )
    assert done.returncode == 0, done.stderr
    spans = spans_in(done.stdout)
    attempts = {
        (s["attributes"]["replayq.job_id"], s["attributes"]["replayq.attempt"]): s
        for s in spans
        if s["name"].startswith("replayq.attempt ")
    }
    assert set(attempts) == {(flaky, 1), (flaky, 2), (notify, 1)}, done.stdout
    for span in attempts.values():
        assert span["context"]["trace_id"] == f"0x{caller.trace_id:032x}"
        assert span["parent_id"] == f"0x{caller.span_id:016x}"
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["resource"]["attributes"]["service.name"] == "shop-worker"
    first, retry = attempts[(flaky, 1)], attempts[(flaky, 2)]
    assert first["status"]["status_code"] == "ERROR"
    assert [link["context"]["span_id"] for link in retry["links"]] == [first["context"]["span_id"]]
    [effect] = [s for s in spans if s["name"] == "effect mail.send"]
    [step] = [s for s in spans if s["name"] == "step send"]
    assert effect["parent_id"] == step["context"]["span_id"]
    assert step["parent_id"] == attempts[(notify, 1)]["context"]["span_id"]


def test_an_exporter_that_is_not_installed_is_named_and_no_job_runs(
    sqlite_url: str, tmp_path: Path
) -> None:
    app = observed.declare(replayq.App(sqlite_url, auto_migrate=True))
    job_id = app.enqueue("flaky", {"n": 1})
    done = run_worker(sqlite_url, {"OTEL_TRACES_EXPORTER": "zipkin_json"})
    assert done.returncode != 0
    assert "OTEL_TRACES_EXPORTER names 'zipkin_json'" in done.stderr
    assert app.get_job(job_id).state == "queued"
    app.close()
