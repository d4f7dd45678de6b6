"""A worker SIGKILLed while it drains a SQLite queue leaves its WAL behind, and the next
process to open the file recovers it: every ack that committed is kept, the rest are
re-delivered and finish, no job lost and none run twice (docs/operations.md, "A process
killed with ``SIGKILL`` still leaves its WAL").

The worker is a real ``replayq worker`` process; the test reads the job rows through a
read-only connection of its own while the worker is stopped (``SIGSTOP``: no commit can
land between that read and the kill), closes it, and only then kills the worker, so the
WAL is read back by a process that did not have the file open when its writer died.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import wal_kill

JOBS = 150


def states(db: Path) -> dict[int, str]:
    """Each job's state, read through a read-only connection closed before returning."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT id, state FROM rq_jobs"))
    finally:
        conn.close()


def states_in_a_new_process(db: Path) -> dict[int, str]:
    """Each job's state as a process that opens the file afresh reads it (it recovers the WAL)."""
    script = (
        "import json, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1])\n"
        "print(json.dumps(dict(conn.execute('SELECT id, state FROM rq_jobs'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(db)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return {int(job_id): state for job_id, state in json.loads(done.stdout).items()}


def test_a_sigkilled_worker_leaves_its_wal_and_nothing_it_acked_is_lost(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    side_file = tmp_path / "runs.jsonl"
    app = wal_kill.build(f"sqlite:///{db}")
    ids = [app.enqueue("tally", {"log": str(side_file), "n": n}) for n in range(JOBS)]
    app.close()
    launcher = WorkerLauncher(db, tmp_path)
    try:
        doomed = launcher.start("doomed", app="tests.apps.wal_kill:app", concurrency=2)
        wait_for(
            lambda: sum(s == "succeeded" for s in states(db).values()) >= 30,
            timeout=30,
            what="the worker to ack 30 jobs",
        )
        doomed.signal(signal.SIGSTOP)
        acked = {job_id for job_id, state in states(db).items() if state == "succeeded"}
        assert len(acked) < JOBS, "the kill should come before the drain ends"
        doomed.signal(signal.SIGKILL)
        doomed.wait(10)
        wal = db.with_name(db.name + "-wal")
        assert wal.exists() and wal.stat().st_size > 0, "the killed worker left its WAL"

        recovered = states_in_a_new_process(db)
        assert sorted(recovered) == sorted(ids)
        assert {j for j, s in recovered.items() if s == "succeeded"} >= acked
        runs_before = read_lines(side_file)

        launcher.start("survivor", app="tests.apps.wal_kill:app", concurrency=2)
        wait_for(
            lambda: all(s == "succeeded" for s in states(db).values()),
            timeout=30,
            what=f"all {JOBS} jobs to succeed",
        )
    finally:
        launcher.kill_all()

    final = states_in_a_new_process(db)
    assert sorted(final) == sorted(ids), "nothing lost, nothing invented"
    by_job = dict(zip(ids, range(JOBS), strict=True))
    runs = read_lines(side_file)
    for job_id in acked:
        n = by_job[job_id]
        assert [line["event"] for line in runs if line["n"] == n] == ["start", "end"], (
            f"job {job_id}, acked before the kill, ran again"
        )
    for n in range(JOBS):
        assert [line for line in runs if line["n"] == n and line["event"] == "end"], n
    assert len(runs) > len(runs_before), "the survivor ran the jobs the kill cut short"
    conn = sqlite3.connect(db)
    try:
        versions = dict(
            conn.execute(
                "SELECT key, count(*) FROM rq_entity_versions WHERE namespace = 'tally' "
                "GROUP BY key"
            )
        )
    finally:
        conn.close()
    assert versions == {str(n): 1 for n in range(JOBS)}, "each job's write applied once"
