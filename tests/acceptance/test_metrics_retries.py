"""A real worker's /metrics while jobs retry, run out of attempts and enqueue a duplicate.

Each attempt is counted once however many retries a job takes: a job that succeeds on
its third attempt is three leases, two failures, two retries and one success; one that
fails all three is three failures, two retries and one burial. A child enqueued with a
message id already taken is one deduplicated enqueue, in the worker that enqueued it.
Nothing moves between two scrapes of an idle worker, the in-flight gauge is back at
zero, and no error message becomes a label value. The fleet's backlog gauge of a queue
that drained reads 0, not "no data".
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import replayq
from tests.acceptance.test_metrics_scrape import Samples, _try_scrape, free_port, scrape, value
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, wait_for
from tests.apps import metered

GROUP = {"queue": "default", "job_type": "child", "version": "none"}
LABELS = {"job_type", "version", "queue", "error_class", "reason", "outcome", "le"}


def test_retries_burials_and_a_duplicate_child_are_counted_once_each(
    launcher: WorkerLauncher,
) -> None:
    app = metered.declare(replayq.App(launcher.url))
    try:
        taken = app.enqueue("child", {"order_id": 7}, message_id="child-7")
        jobs = {
            "wobbly": app.enqueue("wobbly", {"n": 1}),
            "worn_out": app.enqueue("worn_out", {}),
            "fan_out": app.enqueue("fan_out", {"order_id": 7}),
        }
        port = free_port()
        worker = launcher.start(
            "w1", app="tests.apps.metered:app", options=("--metrics-port", str(port))
        )
        expected = {"wobbly": "succeeded", "worn_out": "dead", "fan_out": "succeeded"}

        def settled() -> bool:
            states = {name: app.get_job(job_id).state for name, job_id in jobs.items()}
            return states == expected and app.get_job(taken).state == "succeeded"

        wait_for(settled, timeout=60, what=f"every job settled\n{worker.log()}")
        assert [j.id for j in app.list_jobs(job_type="child")] == [taken], "no second child"
        wait_for(
            lambda: value(scrape(port), "replayq_jobs_succeeded_total") == 3,
            timeout=15,
            what="the last success counted",
        )
        samples = scrape(port)
    finally:
        app.close()

    def count(name: str, **labels: str) -> float:
        return value(samples, name, **labels)

    base = {"version": "v1", "queue": "default"}
    # Succeeded on attempt 3: every attempt once.
    assert count("replayq_jobs_leased_total", job_type="wobbly", **base) == 3
    assert count("replayq_jobs_failed_total", job_type="wobbly", error_class="transient") == 2
    assert count("replayq_retries_total", job_type="wobbly", error_class="transient") == 2
    assert count("replayq_jobs_succeeded_total", job_type="wobbly") == 1
    assert count("replayq_job_duration_seconds_count", job_type="wobbly", outcome="failed") == 2
    assert count("replayq_job_duration_seconds_count", job_type="wobbly", outcome="succeeded") == 1
    assert count("replayq_attempts_per_job_count", job_type="wobbly", outcome="succeeded") == 1
    assert count("replayq_attempts_per_job_sum", job_type="wobbly", outcome="succeeded") == 3
    assert count("replayq_ack_latency_seconds_count", job_type="wobbly") == 1
    assert count("replayq_jobs_dead_total", job_type="wobbly") == 0
    # Failed all three: three failures, two retries, one burial.
    assert count("replayq_jobs_leased_total", job_type="worn_out") == 3
    assert count("replayq_jobs_failed_total", job_type="worn_out") == 3
    assert count("replayq_retries_total", job_type="worn_out") == 2
    assert (
        count(
            "replayq_jobs_dead_total",
            job_type="worn_out",
            error_class="transient",
            reason="attempts_exhausted",
            **base,
        )
        == 1
    )
    assert count("replayq_attempts_per_job_sum", job_type="worn_out", outcome="dead") == 3
    assert count("replayq_ack_latency_seconds_count", job_type="worn_out") == 0
    # The duplicate child, counted on the job it was answered with.
    assert count("replayq_enqueues_deduplicated_total", job_type="child", **base) == 1
    assert count("replayq_enqueues_deduplicated_total") == 1
    assert count("replayq_jobs_succeeded_total", job_type="child") == 1
    assert count("replayq_worker_in_flight") == 0

    again = scrape(port)
    assert _counted(again) == _counted(samples), "an idle worker's counts do not move"
    for (name, labels), _ in samples.items():
        if name.startswith("replayq_"):
            assert {k for k, _ in labels} <= LABELS, name
            assert not any("timed out" in v or "child-7" in v for _, v in labels), name


def _counted(samples: Samples) -> Samples:
    """The counters and histograms (gauges such as the connections held may move)."""
    kinds = ("_total", "_count", "_sum", "_bucket")
    return {
        k: v for k, v in samples.items() if k[0].startswith("replayq_") and k[0].endswith(kinds)
    }


def test_a_drained_backlog_reads_zero_on_the_fleet_gauges_not_no_data(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    app = metered.declare(replayq.App(launcher.url))
    port = free_port()
    output = tmp_path / "fleet.log"
    with output.open("wb") as sink:
        server = subprocess.Popen(
            [REPLAYQ, "--db", launcher.url, "metrics", "serve", "--port", str(port)],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        jobs = [app.enqueue("child", {"order_id": n}) for n in range(3)]
        backlog = ("replayq_jobs", frozenset({**GROUP, "state": "queued"}.items()))
        try:
            samples = wait_for(lambda: _try_scrape(port), timeout=20, what="fleet metrics")
        except AssertionError:
            raise AssertionError(output.read_text()) from None
        assert samples[backlog] == 3

        launcher.start("w1", app="tests.apps.metered:app", burst=True)
        wait_for(
            lambda: {app.get_job(j).state for j in jobs} == {"succeeded"},
            timeout=60,
            what="the backlog drained",
        )
        # The series is still there, at 0: a graph or an alert sees the queue empty.
        assert scrape(port).get(backlog) == 0
        assert (
            scrape(port).get(("replayq_jobs", frozenset({**GROUP, "state": "dead"}.items()))) == 0
        )
    finally:
        server.terminate()
        server.wait(10)
        app.close()
