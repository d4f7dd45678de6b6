"""Scrape a real worker's /metrics, and the fleet's, after a run that did each thing once.

The worker is ``replayq worker --metrics-port`` as an operator starts it; the run
has a retry, a dead job, a lease expiry, a lock that expired before completion, a
stale cache read, a cache entry that cannot be decoded and a value that cannot be
encoded, and a deduplicated effect. Each must be counted, with the job type,
version and queue (and error class, cache namespace) it belongs to, and nothing else.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import replayq
from tests.acceptance.workers import REPLAYQ, ROOT, WorkerLauncher, wait_for
from tests.apps import observed
from tests.context_support import query

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples carrying at least ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def run_everything_once(app: replayq.App) -> dict[str, int]:
    app.state.put("user", 1, {"name": "Ada"}, expected_version=0)
    app.state.put("user", 1, {"name": "Ada L."}, expected_version=1)
    # Another writer cached sku-1's price in a format replayq's codec cannot read.
    query(
        app.url,
        "INSERT INTO rq_cache (key, base_key, value, version, written_at) VALUES (?, ?, ?, ?, ?)",
        ("price:sku-1:v1", "price:sku-1", "\x80\x04binary-format-v0", 1, time.time()),
    )
    return {
        "flaky": app.enqueue("flaky", {"n": 1}),
        "doomed": app.enqueue("doomed", {"reason": "<script>alert(1)</script> not paid"}),
        "overrun": app.enqueue("overrun", {}),
        "lock_overrun": app.enqueue("lock_overrun", {}),
        "stale_profile": app.enqueue("stale_profile", {"user_id": 1}),
        "notify": app.enqueue("notify", {"order_id": 7}, message_id="n-1"),
        "notify_again": app.enqueue("notify", {"order_id": 7}, message_id="n-2"),
        "price_codec": app.enqueue("price_codec", {"sku": "sku-1"}),
        "create_13": app.enqueue("order_event", {"order_id": 13, "event": "create"}),
        "cancel_13": app.enqueue("order_event", {"order_id": 13, "event": "cancel"}),
    }


DIES = {"doomed", "create_13"}


def settled(app: replayq.App, jobs: dict[str, int]) -> bool:
    states = {name: app.get_job(job_id).state for name, job_id in jobs.items()}
    return all(state == ("dead" if name in DIES else "succeeded") for name, state in states.items())


def test_a_real_workers_metrics_count_each_incident_with_bounded_labels(
    launcher: WorkerLauncher,
) -> None:
    app = observed.declare(replayq.App(launcher.url))
    jobs = run_everything_once(app)
    port = free_port()
    worker = launcher.start(
        "w1",
        app="tests.apps.observed:app",
        concurrency=2,
        options=("--metrics-port", str(port), "--log-format", "json"),
    )
    wait_for(lambda: settled(app, jobs), timeout=60, what=f"every job settled\n{worker.log()}")
    # The refused settle of the overrun's first attempt comes after the second one acked.
    wait_for(
        lambda: value(scrape(port), "replayq_settles_rejected_total", job_type="overrun"),
        timeout=15,
        what="the overrun's late settle was refused and counted",
    )
    samples = scrape(port)
    base = {"version": "v1", "queue": "default"}

    assert (
        value(samples, "replayq_retries_total", job_type="flaky", error_class="transient", **base)
        == 1
    )
    assert value(samples, "replayq_jobs_succeeded_total", job_type="flaky", **base) == 1
    assert (
        value(samples, "replayq_jobs_failed_total", job_type="doomed", error_class="validation")
        == 1
    )
    assert (
        value(
            samples,
            "replayq_jobs_dead_total",
            job_type="doomed",
            error_class="validation",
            reason="not_retryable",
            **base,
        )
        == 1
    )
    assert value(samples, "replayq_lease_expiries_total", job_type="overrun", **base) == 1
    assert value(samples, "replayq_redeliveries_total", job_type="overrun") == 1
    assert value(samples, "replayq_locks_expired_total", job_type="lock_overrun", **base) == 1
    assert value(samples, "replayq_locks_acquired_total", job_type="lock_overrun") == 1
    assert value(samples, "replayq_cache_stale_reads_total", job_type="stale_profile", **base) == 1
    assert (
        value(
            samples,
            "replayq_cache_reads_total",
            job_type="stale_profile",
            namespace="profile",
            result="hit",
        )
        == 1
    )
    # The TTL expiry pattern: the TTL the write set, and how old the entry was when read.
    profile = {"job_type": "stale_profile", "namespace": "profile", **base}
    assert value(samples, "replayq_cache_ttl_seconds_count", **profile) == 1
    assert value(samples, "replayq_cache_ttl_seconds_sum", **profile) == 300
    assert value(samples, "replayq_cache_ttl_seconds_bucket", le="60.0", **profile) == 0
    assert value(samples, "replayq_cache_ttl_seconds_bucket", le="300.0", **profile) == 1
    assert value(samples, "replayq_cache_hit_age_seconds_count", **profile) == 1
    assert 0 <= value(samples, "replayq_cache_hit_age_seconds_sum", **profile) < 60
    # Resource usage of the worker process: CPU, memory, file descriptors, connections.
    assert value(samples, "process_cpu_seconds_total") > 0
    assert value(samples, "process_resident_memory_bytes") > 10_000_000
    assert value(samples, "process_open_fds") >= 3
    assert value(samples, "replayq_db_connections") >= 1
    codec_errors = {"job_type": "price_codec", "namespace": "price", **base}
    assert (
        value(samples, "replayq_cache_codec_errors_total", direction="decode", **codec_errors) == 1
    )
    assert (
        value(samples, "replayq_cache_codec_errors_total", direction="encode", **codec_errors) == 1
    )
    # The undecodable entry read as a miss: the handler went on and the job succeeded.
    assert value(samples, "replayq_cache_reads_total", result="miss", **codec_errors) == 1
    assert value(samples, "replayq_effects_total", job_type="notify", kind="mail.send") == 1
    assert (
        value(
            samples,
            "replayq_effects_deduplicated_total",
            job_type="notify",
            kind="mail.send",
            **base,
        )
        == 1
    )
    # The duration histogram saw every attempt that settled, including the failed ones.
    assert value(samples, "replayq_job_duration_seconds_count", outcome="succeeded") == 8
    assert value(samples, "replayq_job_duration_seconds_count", outcome="failed") == 3
    assert value(samples, "replayq_attempts_per_job_count", job_type="flaky") == 1
    assert value(samples, "replayq_attempts_per_job_sum", job_type="flaky") == 2
    assert value(samples, "replayq_lease_seconds", job_type="overrun") == 1.0

    # Bounded labels: no job id, key, message or payload ever becomes a label value.
    allowed = {
        "job_type",
        "version",
        "queue",
        "error_class",
        "reason",
        "kind",
        "result",
        "outcome",
        "where",
        "deduplicated",
        "namespace",
        "direction",
        "le",
    }
    for (name, labels), _ in samples.items():
        if name.startswith("replayq_"):
            assert {k for k, _ in labels} <= allowed, name
            assert not any("script" in v or "mail:" in v for _, v in labels), name

    # Every record of a job carries its fields (the json log format).
    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    [flaky_retry] = [r for r in records if r["message"].startswith(f"job {jobs['flaky']} failed")]
    assert flaky_retry["job_id"] == jobs["flaky"]
    assert flaky_retry["attempt"] == 1
    assert flaky_retry["version"] == "v1"
    assert flaky_retry["worker_id"] == "w1"
    assert flaky_retry["trace_id"] == app.get_job(jobs["flaky"]).trace_id
    handler_records = [
        r
        for r in records
        if r["logger"] == "tests.apps.observed" and r["message"].startswith("flaky")
    ]
    assert {r["attempt"] for r in handler_records} == {1, 2}
    assert all(r["job_id"] == jobs["flaky"] for r in handler_records)
    app.close()


def test_the_fleet_metrics_read_backlog_dead_and_in_flight_from_the_database(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    app = observed.declare(replayq.App(launcher.url))
    jobs = run_everything_once(app)
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
        try:
            samples = wait_for(lambda: _try_scrape(port), timeout=20, what="fleet metrics")
        except AssertionError:
            raise AssertionError(output.read_text()) from None
        assert value(samples, "replayq_jobs", state="queued") == len(jobs)
        assert (
            value(samples, "replayq_jobs", job_type="notify", state="queued", queue="default") == 2
        )
        assert value(samples, "replayq_oldest_ready_age_seconds", job_type="flaky") >= 0
        assert value(samples, "replayq_jobs", state="dead") == 0
        assert value(samples, "replayq_jobs_out_of_order") == 0

        worker = launcher.start("w1", app="tests.apps.observed:app", concurrency=2)
        wait_for(lambda: settled(app, jobs), timeout=60, what=f"settled\n{worker.log()}")
        samples = scrape(port)
        assert value(samples, "replayq_jobs", state="queued") == 0
        assert value(samples, "replayq_jobs", state="running") == 0
        assert value(samples, "replayq_jobs", job_type="doomed", version="v1", state="dead") == 1
        # The cancel of order 13 ran although its create had died: out of order on its key.
        assert (
            value(samples, "replayq_jobs_out_of_order", job_type="order_event", version="v1") == 1
        )
        assert value(samples, "replayq_jobs_out_of_order") == 1
        assert value(samples, "replayq_effects_in_doubt") == 0
        assert value(samples, "replayq_replays_total") == 0

        # Replays run in the operator's process; the fleet counts them from the database.
        replayq.dry_run(app, jobs["stale_profile"])  # again: the same success
        replayq.dry_run(app, jobs["doomed"])  # fails the same way: reproduced too
        replayq.fork(app, jobs["notify"], from_step="send", overrides={"order_id": 8})
        samples = scrape(port)
        replays = "replayq_replays_total"
        assert value(samples, replays) == 3
        assert (
            value(
                samples,
                replays,
                mode="replay",
                job_type="stale_profile",
                version="v1",
                outcome="succeeded",
                diverged="false",
            )
            == 1
        )
        assert (
            value(
                samples,
                replays,
                mode="replay",
                job_type="doomed",
                outcome="failed",
                diverged="false",
            )
            == 1
        )
        # The fork mailed order 8 where the original mailed order 7: its effects differ.
        assert value(samples, replays, mode="fork", job_type="notify", diverged="true") == 1
        assert value(samples, replays) == 3  # counted once, however often scraped
    finally:
        server.kill()
        server.wait(10)
        app.close()


def _try_scrape(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None
