"""A worker frozen holding jobs leased ahead does not run them when it wakes, once
another worker has taken them.

``w1`` (one executor, ``--prefetch 4 --prefetch-window inf``) leases five jobs in one
batch and starts the first, a long one; the other four wait in it, leased ahead. It is
frozen (SIGSTOP) there. ``w2`` reaps all five after their one-second leases and runs
them. ``w1`` is then thawed: the first job's handler, already running, finishes and its
late settle is refused (``job.write_rejected``, as in ``test_stalled_worker.py``); the
four it had not started are dropped unrun (``lease.lost``, ``started: false``). The side
file, written by the handler outside ``ctx`` (where a duplicate run could do harm no
fencing takes back), shows ``w1`` entered one handler only, and every job succeeded
once, ``w2``'s. ``w1`` lives on and drains new jobs.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for

AHEAD = 4
JOBS = AHEAD + 1
PREFETCH = ("--prefetch", str(AHEAD), "--prefetch-window", "inf")


def test_jobs_held_ahead_by_a_frozen_worker_and_taken_over_do_not_run_in_it_again(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    # The first job sleeps: the four after it wait in w1, leased ahead and unstarted.
    ids = [
        sleepy_app.enqueue("sleep", {"log": str(side_file), "n": n, "seconds": 0.0 if n else 1.5})
        for n in range(JOBS)
    ]
    w1 = launcher.start("w1", options=PREFETCH)

    def entered(pid: int) -> list[int]:
        return sorted(
            line["n"]
            for line in read_lines(side_file)
            if line["event"] == "start" and line["pid"] == pid
        )

    wait_for(lambda: entered(w1.pid) == [0], timeout=30, what="w1 to start the first job")
    # The premise: the whole batch is w1's, and only the first job was entered.
    held = [sleepy_app.get_job(job_id) for job_id in ids]
    assert [(j.state, j.worker_id) for j in held] == [(replayq.JobState.RUNNING, "w1")] * JOBS
    w1.signal(signal.SIGSTOP)
    assert entered(w1.pid) == [0]

    w2 = launcher.start("w2")

    def all_succeeded() -> bool:
        return all(sleepy_app.get_job(job_id).state is replayq.JobState.SUCCEEDED for job_id in ids)

    wait_for(all_succeeded, timeout=60, what="w2 to reap w1's batch and run it")
    assert entered(w2.pid) == list(range(JOBS))

    w1.signal(signal.SIGCONT)

    def w1_said(name: str) -> list[replayq.TraceEvent]:
        return [
            e
            for job_id in ids
            for e in sleepy_app.trace(job_id)
            if e.worker_id == "w1" and e.name == name
        ]

    # The running job's late settle is refused. w1 drains on: its executor went past the
    # jobs it held ahead, and it takes new work (w2 gone).
    wait_for(lambda: w1_said("job.write_rejected"), timeout=30, what="w1's refused settle")
    w2.kill()
    late = sleepy_app.enqueue("sleep", {"log": str(side_file), "n": JOBS, "seconds": 0.0})
    wait_for(
        lambda: sleepy_app.get_job(late).state is replayq.JobState.SUCCEEDED,
        timeout=30,
        what="w1 to run a new job",
    )
    assert entered(w1.pid) == [0, JOBS], "w1 ran a handler of a job it no longer held"
    assert [e.job_id for e in w1_said("job.write_rejected")] == [ids[0]]
    # The four it had not started were dropped unrun, their trace says so.
    dropped = [e.job_id for e in w1_said("lease.lost") if e.data.get("started") is False]
    assert sorted(dropped) == ids[1:]
    for job_id in ids:
        job = sleepy_app.get_job(job_id)
        assert (job.state, job.worker_id) == (replayq.JobState.SUCCEEDED, "w2")
        assert job.result["pid"] == w2.pid
        names = Counter(e.name for e in sleepy_app.trace(job_id))
        assert names["job.succeeded"] == 1, names
        assert names["lease.expired"] == 1 and names["job.redelivered"] == 1, names
    assert "Traceback" not in w1.log(), w1.log()
