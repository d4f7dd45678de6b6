"""The outage log's promise (docs/reliability.md, "Storage faults a worker waits out"): an
outage is logged once per cause when it starts and once when it ends (``database reachable
again after N failed tries``); the retries in between are debug records.

A real worker process drains jobs while another process holds the SQLite file's write
lock for 4 s, far past the URL's ``busy_timeout`` (200 ms): every loop of the worker that
writes (the dispatcher's leases, the heartbeat, the acks, the settles) meets the lock
several times over.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.acceptance.test_sqlite_faults import HOLD_LOCK
from tests.acceptance.workers import WorkerLauncher, wait_for, workers_ended
from tests.apps import sleepy

# The line that starts an outage, and the line that ends it (``replayq.storage.reconnect``).
STARTED = re.compile(
    r"WARNING replayq\.reconnect: (?P<what>.+?): database unavailable \((?P<cause>.*)\); retrying"
)
# The group commits' own words for it, naming the acks that wait (``worker/acks.py``).
ACKS_STARTED = re.compile(
    r"WARNING replayq\.worker: (?P<worker>worker \S+): group commit of the acks of jobs "
    r"\[[\d, ]+\] failed \((?P<cause>.*)\); tried again"
)
ENDED = re.compile(
    r"INFO replayq\.reconnect: (?P<what>.+?): database reachable again after (?P<tries>\d+) failed"
)


@pytest.mark.timeout(90)
def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    database = tmp_path / "queue.db"
    launcher = WorkerLauncher(f"sqlite:///{database}?busy_timeout=200", tmp_path)
    app = sleepy.build(launcher.url)
    log = str(tmp_path / "runs.jsonl")
    total = 80
    try:
        with workers_ended(request, launcher):
            for n in range(total):
                app.enqueue("sleep", {"log": log, "n": n, "seconds": 0.1})
            worker = launcher.start("w", concurrency=2)
            wait_for(
                lambda: any(j.state.value == "succeeded" for j in app.list_jobs(limit=total)),
                timeout=30,
                what="work under way",
            )
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLD_LOCK, str(database), "4"],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            assert holder.wait(30) == 0
            holder.stdout.close()
            wait_for(
                lambda: all(j.state.value == "succeeded" for j in app.list_jobs(limit=total)),
                timeout=60,
                what=f"all {total} jobs to succeed after the lock",
            )
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
            text = worker.log()
            # A lease that ran out during the outage was re-delivered after it, and its late
            # settle refused: each job settled once.
            settled = Counter(
                sum(e.name == "job.succeeded" for e in app.trace(job.id))
                for job in app.list_jobs(limit=total)
            )
            assert settled == {1: total}, settled
    finally:
        app.close()
    lines = text.splitlines()
    # Every warning that names the outage's cause is the start of an outage, in one form.
    about_it = [line for line in lines if " WARNING " in line and "database is locked" in line]
    started = [_started(line) for line in about_it]
    assert None not in started, "a retry was logged as a warning:\n" + "\n".join(
        line for line, s in zip(about_it, started, strict=True) if s is None
    )
    assert started, f"the outage was not logged at all:\n{text}"
    per_loop = Counter(started)
    assert max(per_loop.values()) == 1, f"a loop logged the same cause twice: {per_loop}"
    ended = [m.groupdict() for m in map(ENDED.search, lines) if m]
    assert Counter(e["what"] for e in ended) == Counter({what for what, _ in started}), (
        f"each loop that logged the outage's start logs its end, once:\n{text}"
    )
    tries = sum(int(e["tries"]) for e in ended)
    assert tries > len(started), "many retries, few lines"


def _started(line: str) -> tuple[str, str] | None:
    """The loop and the cause of a line that starts an outage; ``None`` for another line."""
    if found := STARTED.search(line):
        return found["what"], found["cause"]
    if found := ACKS_STARTED.search(line):
        return f"{found['worker']}: acks", found["cause"]
    return None
