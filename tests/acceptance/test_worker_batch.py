"""Batched claims and grouped acks: what a kill, a stop and a failed group commit leave.

A worker holds ``concurrency + prefetch`` leases: the jobs beyond the running ones
wait leased in the worker. Killed, it loses none of them (they come back after
their lease); stopped, it gives them back at once; a group commit that fails
acks none of its jobs and loses none.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for

BATCH = 4
# One executor, the rest of the batch leased ahead whatever the jobs' pace (a worker leases
# ahead of long jobs only when told to: ``--prefetch-window inf``).
AHEAD = ("--prefetch", str(BATCH - 1), "--prefetch-window", "inf")


def _succeeded_events(app: replayq.App, job_id: int) -> list[replayq.TraceEvent]:
    return [e for e in app.trace(job_id) if e.name == "job.succeeded"]


def _held_by(app: replayq.App, worker_id: str) -> list[replayq.Job]:
    return [j for j in app.list_jobs(states=["running"]) if j.worker_id == worker_id]


def test_sigkilled_worker_loses_none_of_its_leased_but_unstarted_batch(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    ids = [
        sleepy_app.enqueue("sleep", {"log": str(side_file), "n": n, "seconds": 3.0})
        for n in range(BATCH)
    ]
    doomed = launcher.start(
        "doomed", options=("--prefetch", str(BATCH - 1), "--prefetch-window", "inf")
    )
    wait_for(
        lambda: len(_held_by(sleepy_app, "doomed")) == BATCH and read_lines(side_file),
        timeout=20,
        what="the worker to hold the whole batch and start one job",
    )
    started = {line["n"] for line in read_lines(side_file) if line["event"] == "start"}
    assert len(started) == 1, "one executor: the rest of the batch waits, leased, unstarted"

    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    assert len(_held_by(sleepy_app, "doomed")) == BATCH, "the kill left the batch leased"

    launcher.start("survivor", concurrency=BATCH)
    wait_for(
        lambda: len(sleepy_app.list_jobs(states=["succeeded"])) == BATCH,
        timeout=60,
        what=f"all {BATCH} jobs to succeed",
    )

    jobs = {job.id: job for job in sleepy_app.list_jobs(limit=1000)}
    assert sorted(jobs) == sorted(ids), "nothing lost or invented"
    ends = Counter(line["n"] for line in read_lines(side_file) if line["event"] == "end")
    assert ends == Counter(range(BATCH)), "each job's handler ran to the end exactly once"
    for job_id in ids:
        job = jobs[job_id]
        assert job.state is replayq.JobState.SUCCEEDED
        assert job.redelivery_count == 1, "it came back after its lease"
        assert [e.worker_id for e in _succeeded_events(sleepy_app, job_id)] == ["survivor"]
        names = [(e.name, e.worker_id) for e in sleepy_app.trace(job_id)]
        assert ("job.leased", "doomed") in names
        assert ("lease.expired", "survivor") in names


def test_stopping_worker_releases_its_unstarted_batch_at_once(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    # 120 s leases: a job another worker runs within the test's minute was released, not
    # reaped after its lease.
    first = sleepy_app.enqueue("sleep_long_lease", {"log": str(side_file), "n": 0, "seconds": 10})
    rest = [
        sleepy_app.enqueue("sleep_long_lease", {"log": str(side_file), "n": n, "seconds": 0.1})
        for n in range(1, BATCH)
    ]
    stopping = launcher.start(
        "stopping", grace=30, options=("--prefetch", str(BATCH - 1), "--prefetch-window", "inf")
    )
    wait_for(
        lambda: len(_held_by(sleepy_app, "stopping")) == BATCH and read_lines(side_file),
        timeout=20,
        what="the worker to hold the whole batch and start the first job",
    )

    stopping.signal(signal.SIGTERM)
    wait_for(
        lambda: all(sleepy_app.get_job(i).state is replayq.JobState.QUEUED for i in rest),
        timeout=20,
        what="the unstarted jobs to be back in the queue while the first still runs",
    )
    assert sleepy_app.get_job(first).state is replayq.JobState.RUNNING
    launcher.start("next", burst=True).wait(60)

    assert stopping.wait(30) == 0, stopping.log()
    assert sleepy_app.get_job(first).worker_id == "stopping", "the started job finished there"
    for job_id in [first, *rest]:
        assert sleepy_app.get_job(job_id).state is replayq.JobState.SUCCEEDED
        assert len(_succeeded_events(sleepy_app, job_id)) == 1
    for job_id in rest:
        names = [(e.name, e.worker_id) for e in sleepy_app.trace(job_id)]
        released = [e for e in sleepy_app.trace(job_id) if e.name == "lease.released"]
        assert [(e.worker_id, e.data["reason"], e.data["started"]) for e in released] == [
            ("stopping", "worker stopped before the job started", False)
        ]
        assert names[-1] == ("job.succeeded", "next")
        job = sleepy_app.get_job(job_id)
        assert job.redelivery_count == 0, "released, never reaped"
        # Given back as if never leased: the one attempt is the one that ran.
        assert (job.attempt, job.max_attempts) == (1, 5)
    ends = Counter(line["n"] for line in read_lines(side_file) if line["event"] == "end")
    assert ends == Counter(range(BATCH)), "each ran exactly once"


def _failed_groups(log: str) -> list[list[int]]:
    """The job ids of each group commit the worker logged as failed."""
    found = re.findall(r"group commit of the acks of jobs \[([\d, ]+)\] failed", log)
    return [[int(i) for i in ids.split(",")] for ids in found]


def test_failed_group_commit_acks_none_of_its_jobs_and_loses_none(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    # One executor, the batch leased ahead. On PostgreSQL the first job's ack commits
    # alone (the second job outlasts the ack window) and the others' gather behind it;
    # on SQLite a long window makes all four one group (the last job's end asks for it).
    sqlite = launcher.backend == "sqlite"
    seconds = [2.0, 0.0] if sqlite else [1.0, 0.3]
    seconds += [0.0] * (BATCH - 2)
    ids = [
        sleepy_app.enqueue(
            "sleep_long_lease", {"log": str(side_file), "n": n, "seconds": seconds[n]}
        )
        for n in range(BATCH)
    ]
    window = "30" if sqlite else "0.005"
    worker = launcher.start(
        "grouped",
        options=("--prefetch", str(BATCH - 1), "--prefetch-window", "inf", "--ack-window", window),
    )
    wait_for(
        lambda: len(_held_by(sleepy_app, "grouped")) == BATCH and read_lines(side_file),
        timeout=20,
        what="the worker to hold the whole batch and start the first job",
    )
    if sqlite:
        _hold_sqlite_write_lock_past_busy_timeout(launcher, sleepy_app, ids, side_file)
    else:
        _terminate_session_at_group_commit(launcher, sleepy_app, ids, side_file)

    wait_for(
        lambda: all(sleepy_app.get_job(i).state is replayq.JobState.SUCCEEDED for i in ids),
        timeout=60,
        what="every job of the failed group to succeed",
    )
    failed = _failed_groups(worker.log())
    assert failed, worker.log()
    assert {i for group in failed for i in group} <= set(ids)
    if sqlite:
        assert sorted(failed[0]) == sorted(ids), "the whole batch was one group"
    for job_id in ids:
        events = _succeeded_events(sleepy_app, job_id)
        assert [e.worker_id for e in events] == ["grouped"], "acked exactly once, none lost"
    ends = Counter(line["n"] for line in read_lines(side_file) if line["event"] == "end")
    assert ends == Counter(range(BATCH))


def _hold_sqlite_write_lock_past_busy_timeout(
    launcher: WorkerLauncher, app: replayq.App, ids: list[int], side_file: Path
) -> None:
    """Lock the database from this process (``BEGIN EXCLUSIVE``) while the batch ends, past
    the worker's 5 s busy timeout: its group commit fails ("database is locked") and
    commits nothing."""
    assert isinstance(launcher.database, Path)
    blocker = sqlite3.connect(launcher.database, isolation_level=None, timeout=30)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        wait_for(
            lambda: _ends(side_file) == BATCH,
            timeout=20,
            what="every handler to end while the write lock is held",
        )
        deadline = time.monotonic() + 30
        while not _failed_groups(launcher.started[-1].log()) and time.monotonic() < deadline:
            # Read while the lock is held (WAL readers are not blocked): nothing acked.
            states = {app.get_job(i).state for i in ids}
            assert states == {replayq.JobState.RUNNING}, states
            time.sleep(0.1)
        assert _failed_groups(launcher.started[-1].log()), launcher.started[-1].log()
        assert {app.get_job(i).state for i in ids} == {replayq.JobState.RUNNING}
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def _terminate_session_at_group_commit(
    launcher: WorkerLauncher, app: replayq.App, ids: list[int], side_file: Path
) -> None:
    """Row-lock the first and the last job of the batch from this process: the group
    commit waits on the first; once that lock is gone it writes the acks of the jobs
    between and waits on the last. Then its session is terminated mid-transaction."""
    assert isinstance(launcher.database, str)
    first, *between, last = ids
    url = launcher.database
    with (
        psycopg.connect(url) as hold_first,
        psycopg.connect(url) as hold_last,
        psycopg.connect(url, autocommit=True) as probe,
    ):
        hold_first.execute("SELECT id FROM rq_jobs WHERE id = %s FOR UPDATE", [first])
        hold_last.execute("SELECT id FROM rq_jobs WHERE id = %s FOR UPDATE", [last])
        wait_for(
            lambda: _ends(side_file) == BATCH,
            timeout=20,
            what="every handler to end while the first job's row is locked",
        )
        hold_first.rollback()
        pid = wait_for(
            lambda: _blocked_by(probe, hold_last.info.backend_pid),
            timeout=20,
            what="the group commit to wait on the last job's row",
        )
        # The jobs between were acked in that transaction, not committed: their rows are
        # locked by it, and read as running.
        written = [i for i in between if _row_locked(probe, i)]
        assert written, "the group commit wrote the acks before the last one's"
        assert {app.get_job(i).state for i in [*between, last]} == {replayq.JobState.RUNNING}
        probe.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(
            lambda: (
                not probe.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            ),
            timeout=20,
            what="the terminated session to be gone",
        )
        hold_last.rollback()


def _ends(side_file: Path) -> int:
    return sum(line["event"] == "end" for line in read_lines(side_file))


def _blocked_by(probe: psycopg.Connection[tuple[int]], holder: int) -> int | None:
    row = probe.execute(
        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [holder]
    ).fetchone()
    return row[0] if row else None


def _row_locked(probe: psycopg.Connection[tuple[int]], job_id: int) -> bool:
    """Whether another transaction holds ``job_id``'s row (``probe`` is autocommit)."""
    try:
        probe.execute("SELECT id FROM rq_jobs WHERE id = %s FOR UPDATE NOWAIT", [job_id])
    except psycopg.errors.LockNotAvailable:
        return True
    return False


pytestmark = pytest.mark.timeout(180)


class _SlowExecutorLease(replayq.Worker):
    """An executor's lease that starts late: the scheduling a loaded machine gives at
    random (an executor thread paused between freeing its slot and leasing), every time."""

    def _lease_free_slots(self) -> tuple[int, list[replayq.Job]]:
        if threading.current_thread().name.startswith("replayq-exec"):
            time.sleep(0.3)  # longer than the dispatcher's poll: the run ends meanwhile
        return super()._lease_free_slots()


def test_a_burst_run_that_returned_leases_nothing_more(tmp_path: Path) -> None:
    """An executor that freed its slot as the dispatcher decided to end used to lease
    afterwards, from a run that had returned: it held the job enqueued next (put behind
    its stop, never run) until that job's lease ran out. The job must stay queued, and
    the run must return with its threads ended."""
    app = replayq.App(f"sqlite:///{tmp_path / 'burst.db'}", auto_migrate=True)
    no_jitter = replayq.Retry(max_attempts=5, base="60s", cap="60s", jitter="none")

    @app.job("unavailable", retry=no_jitter)
    def unavailable(ctx: replayq.Context, n: int) -> None:
        raise replayq.DependencyError("503 Service Unavailable")

    try:
        app.enqueue("unavailable", {"n": 1})
        before = set(threading.enumerate())  # other tests' threads may still be ending
        stats = _SlowExecutorLease(app, burst=True, poll_interval=0.05).run()
        assert stats.leased == stats.retried == 1
        # The run returned with its threads gone: none of them is left to lease.
        new = set(threading.enumerate()) - before
        left = [t.name for t in new if t.name.startswith("replayq-")]
        assert left == [], f"threads of a returned run: {left}"
        after = app.enqueue("unavailable", {"n": 2})
        time.sleep(0.6)  # the paused executor's lease has run by now
        job = app.get_job(after)
        assert job.state == "queued", f"a returned burst run leased job {after} ({job.worker_id})"
    finally:
        app.close()
