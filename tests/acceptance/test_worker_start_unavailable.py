"""A worker started while its database is unavailable waits for it, then works.

The database's directory does not exist yet (a volume not mounted yet): the worker —
with ``--metrics-port``, which reads the storage's connection count — logs why and
keeps waiting instead of exiting for its supervisor to restart. Once the directory is
there and jobs are enqueued, the same process drains them.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import replayq
from tests.acceptance.test_metrics_scrape import free_port
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import sleepy


def test_a_worker_started_before_its_database_exists_waits_and_then_drains(
    tmp_path: Path,
) -> None:
    later = tmp_path / "not-mounted-yet"
    launcher = WorkerLauncher(later / "queue.db", tmp_path)
    port = free_port()
    worker = launcher.start(
        "early", app="tests.apps.sleepy:app", options=("--metrics-port", str(port))
    )
    try:
        wait_for(
            lambda: "database unavailable" in worker.log(),
            timeout=30,
            what="the worker to say why it waits",
        )
        assert "does not exist" in worker.log()
        time.sleep(2.0)
        assert worker.proc.poll() is None, f"the worker exited\n{worker.log()}"

        later.mkdir()
        app = sleepy.build(launcher.url)
        sink = str(tmp_path / "sink.jsonl")
        ids = [app.enqueue("sleep", {"log": sink, "n": n, "seconds": 0}) for n in range(5)]
        wait_for(
            lambda: all(app.get_job(i).state == replayq.JobState.SUCCEEDED for i in ids),
            timeout=60,
            what="the waiting worker to drain the jobs",
        )
        assert {e.worker_id for i in ids for e in app.trace(i) if e.name == "job.leased"} == {
            "early"
        }
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            assert "replayq_db_connections" in page.read().decode()
        app.close()
    except BaseException:
        print(worker.log())
        raise
    finally:
        launcher.kill_all()
