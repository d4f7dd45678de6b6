"""gc runs beside a real worker draining the same queue, and takes nothing a live attempt needs.

Four worker processes drain jobs with a recorded call, a state write and an effect; a
gc process meanwhile runs pass after pass on a clock two days ahead, so every job that
finishes is at once past its one-day full tier and trimmed to its ledger. gc only ever
touches finished jobs: no worker fails, no job dies, each effect runs once, and every job
keeps its ledger — the lifecycle, its effect, its state write — after the last pass.
One job is held inside its step until gc has trimmed others, so the drain is still going
when gc collects (the workers could otherwise finish before a pass begins). On both
backends (``launcher``): on PostgreSQL gc locks its batches ``FOR UPDATE SKIP LOCKED`` and
moves the ledger tier into day partitions while the workers lease, heartbeat and ack.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import replayq
from replayq.queue.retention import RetentionPolicy
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import storage_faults

DAY = 86_400.0
JOBS = 150


def test_gc_passes_beside_draining_workers_trim_only_finished_jobs(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(launcher.url)
    # The gc process: two days ahead, full detail for one day, the ledger for three.
    gc_app = storage_faults.build(launcher.url, offset=2 * DAY)
    gc_app.retention = RetentionPolicy(replayq.Retention(full_days=1, ledger_days=3), {})
    reports: list[replayq.GcReport] = []
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            reports.append(gc_app.gc(batch=50))

    hold, env = storage_faults.hold_inside_step(tmp_path)
    try:
        ids = [app.enqueue("deliver", {"n": n, "sink": str(sink)}) for n in range(JOBS)]
        held_id = ids[storage_faults.HELD_JOB]
        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        workers = [
            launcher.start(f"w{i}", app="tests.apps.storage_faults:app", concurrency=2, env=env)
            for i in range(4)
        ]
        wait_for(lambda: storage_faults.inside(hold), timeout=120, what="the held job to start")
        trimmed_before = sum(r.trimmed_jobs for r in list(reports))
        wait_for(
            lambda: sum(r.trimmed_jobs for r in list(reports)) > trimmed_before,
            timeout=120,
            what="a gc pass to trim finished jobs while one is still held in its step",
        )
        assert app.get_job(held_id).state == replayq.JobState.RUNNING
        hold.unlink()
        wait_for(
            lambda: Counter(j.state.value for j in app.list_jobs(limit=1000))["succeeded"] == JOBS,
            timeout=120,
            what=f"all {JOBS} jobs to succeed beside gc",
        )
        stop.set()
        collector.join(60)
        reports.append(gc_app.gc(batch=50))  # the last pass, after the drain
        trimmed_beside = sum(r.trimmed_jobs for r in reports[:-1])
        assert trimmed_beside > 0, "gc trimmed jobs while the workers drained"

        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert sorted(effects) == list(range(JOBS)) and max(effects.values()) == 1
        for worker in workers:
            assert worker.proc.poll() is None, worker.log()
            assert "Traceback" not in worker.log(), worker.log()
        for job in app.list_jobs(limit=1000):
            names = [e.name for e in app.trace(job.id)]
            assert "job.failed" not in names, (job.id, names)
            # The ledger tier: the lifecycle, the effect, the state write; the reads are gone.
            assert {"job.enqueued", "job.leased", "job.succeeded"} <= set(names), names
            assert "effect.succeeded" in names and "state.write" in names, names
            assert "call" not in names, "trimmed to the ledger"
        if launcher.backend == "postgres":
            import psycopg

            with psycopg.connect(launcher.url) as conn:
                moved = conn.execute("SELECT count(*) FROM rq_trace_ledger").fetchone()
            assert moved is not None and moved[0] > 0, "the ledger tier in its day partitions"
    finally:
        stop.set()
        launcher.kill_all()
        gc_app.close()
        app.close()
