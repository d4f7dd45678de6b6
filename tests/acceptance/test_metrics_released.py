"""A real worker's /metrics counts the jobs it leased ahead and let go of unrun, by reason.

``replayq_jobs_released_total`` is fed by ``Observer.released``: a job the worker leased
(``job_seen``) and that left it without an attempt, so without ``settled``. Before that
hook the metrics observer heard nothing of such a job (and kept its enqueue time for
good). Both ways a prefetched job leaves unrun are caused for real here:

* lost: ``w1`` (one executor, four jobs leased ahead) is frozen with SIGSTOP past the
  jobs' one-second leases while it runs the first; ``w2`` reaps and runs all five. Thawed,
  ``w1`` drops the four it had not started (``lease.lost``, ``started: false``);
* stopped: SIGTERM while the worker runs one job and holds three leased ahead; it gives
  the three back at once (``lease.released``, ``started: false``) and runs on to finish
  the first, ``replayq_worker_in_flight`` saying one attempt runs, not four.
"""

from __future__ import annotations

import signal
from pathlib import Path

import replayq
from tests.acceptance.test_metrics_scrape import free_port, scrape, value
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for

AHEAD = 4


def _options(port: int, ahead: int) -> tuple[str, ...]:
    return (
        "--metrics-port",
        str(port),
        "--prefetch",
        str(ahead),
        "--prefetch-window",
        "inf",
    )


def _scraped(port: int, name: str, **labels: str) -> float | None:
    try:
        return value(scrape(port), name, **labels)
    except OSError:  # the endpoint not up yet
        return None


def test_jobs_held_ahead_and_lost_while_the_worker_was_frozen_are_counted_released(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    ids = [
        sleepy_app.enqueue("sleep", {"log": str(side_file), "n": n, "seconds": 0.0 if n else 1.5})
        for n in range(AHEAD + 1)
    ]
    port = free_port()
    w1 = launcher.start("w1", options=_options(port, AHEAD))

    def w1_entered() -> list[int]:
        lines = read_lines(side_file)
        return [line["n"] for line in lines if line["event"] == "start" and line["pid"] == w1.pid]

    wait_for(lambda: w1_entered() == [0], timeout=30, what="w1 to start the first job")
    held = [sleepy_app.get_job(job_id) for job_id in ids]
    assert [(j.state, j.worker_id) for j in held] == [(replayq.JobState.RUNNING, "w1")] * len(ids)
    assert _scraped(port, "replayq_jobs_leased_total", job_type="sleep") == len(ids)
    w1.signal(signal.SIGSTOP)

    w2 = launcher.start("w2")
    wait_for(
        lambda: all(sleepy_app.get_job(i).state is replayq.JobState.SUCCEEDED for i in ids),
        timeout=60,
        what="w2 to reap w1's batch and run it",
    )
    w2.kill()
    w1.signal(signal.SIGCONT)

    # Thawed, w1 drops the four it held ahead: each counted once, as lost.
    lost = {"job_type": "sleep", "version": "v1", "queue": "default", "reason": "lost"}
    wait_for(
        lambda: _scraped(port, "replayq_jobs_released_total", **lost) == AHEAD,
        timeout=30,
        what=f"w1 to count the {AHEAD} jobs it dropped unrun\n{w1.log()}",
    )
    dropped = [
        e.job_id
        for job_id in ids
        for e in sleepy_app.trace(job_id)
        if e.worker_id == "w1" and e.name == "lease.lost" and e.data.get("started") is False
    ]
    assert sorted(dropped) == ids[1:]
    wait_for(
        lambda: _scraped(port, "replayq_settles_rejected_total", job_type="sleep") == 1,
        timeout=30,
        what="the first job's late settle refused",
    )
    samples = scrape(port)
    assert value(samples, "replayq_jobs_released_total") == AHEAD, "nothing else released"
    assert value(samples, "replayq_worker_in_flight") == 0
    assert entered_by(side_file, w1.pid) == [0], "w1 ran a job it no longer held"
    assert "Traceback" not in w1.log(), w1.log()


def entered_by(side_file: Path, pid: int) -> list[int]:
    return [
        line["n"]
        for line in read_lines(side_file)
        if line["event"] == "start" and line["pid"] == pid
    ]


def test_a_stopping_worker_counts_its_prefetched_batch_released_as_it_gives_it_back(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    # 120 s leases: the jobs come back to the queue by the release, not by a reaper.
    first = sleepy_app.enqueue("sleep_long_lease", {"log": str(side_file), "n": 0, "seconds": 8})
    rest = [
        sleepy_app.enqueue("sleep_long_lease", {"log": str(side_file), "n": n, "seconds": 0.1})
        for n in (1, 2, 3)
    ]
    port = free_port()
    stopping = launcher.start("stopping", grace=30, options=_options(port, len(rest)))
    wait_for(
        lambda: entered_by(side_file, stopping.pid) == [0],
        timeout=30,
        what="the worker to start the first job",
    )
    held = [sleepy_app.get_job(job_id) for job_id in (first, *rest)]
    assert [j.worker_id for j in held] == ["stopping"] * 4, "the batch is held, leased ahead"
    assert _scraped(port, "replayq_worker_in_flight") == 1

    stopping.signal(signal.SIGTERM)
    stopped = {
        "job_type": "sleep_long_lease",
        "version": "v1",
        "queue": "default",
        "reason": "stopped",
    }
    wait_for(
        lambda: _scraped(port, "replayq_jobs_released_total", **stopped) == len(rest),
        timeout=20,
        what=f"the stopping worker to count its unstarted batch released\n{stopping.log()}",
    )
    # Scraped while the first job still runs in the stopping worker's grace.
    assert sleepy_app.get_job(first).state is replayq.JobState.RUNNING
    for job_id in rest:
        assert sleepy_app.get_job(job_id).state is replayq.JobState.QUEUED
    samples = scrape(port)
    assert value(samples, "replayq_jobs_released_total") == len(rest), "nothing else released"
    assert value(samples, "replayq_worker_in_flight") == 1, "the one attempt still running"
    assert entered_by(side_file, stopping.pid) == [0]
