"""``rollout rollback --release-inflight`` with real worker processes.

Four slow v2 attempts are running when the switch is thrown: each stops at its next
step boundary (it never finishes its steps), goes back to the queue on v1, and runs
there once v2's run has ended — never on two versions at once — with the request and
the release in its trace and no attempt counted as a failure or a cancel (each worker's
exit summary counts it as ``released``).
"""

from __future__ import annotations

import re
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import rollout_release

JOBS = 4


@pytest.mark.timeout(120)
def test_rollback_release_inflight_requeues_running_v2_attempts_on_v1(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    side = tmp_path / "runs.jsonl"
    env = {"ROLLOUT_SIDE_FILE": str(side)}
    app = rollout_release.build(launcher.url)
    app.register_contracts()
    app.rollout("slow", actor="drill").start("v2", canary="100%", reason="release drill")
    ids = app.enqueue_many([replayq.EnqueueRequest("slow", {"n": n}) for n in range(JOBS)])
    workers = [
        launcher.start(name, app="tests.apps.rollout_release:app", concurrency=2, env=env)
        for name in ("a", "b")
    ]

    def v2_stepping() -> bool:
        stepped = {line["n"] for line in read_lines(side) if line["event"] == "step"}
        return len(stepped) == JOBS

    wait_for(v2_stepping, timeout=60, what="every job running steps on v2")
    result = CliRunner().invoke(
        main,
        [
            *("--db", launcher.url, "rollout", "rollback", "slow", "--release-inflight"),
            *("--by", "drill", "--reason", "v2 is too slow"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{JOBS} running attempt(s) on other versions go back to the queue" in result.output

    def all_done() -> bool:
        done = app.list_jobs(job_type="slow", states=["succeeded"], limit=JOBS)
        return len(done) == JOBS

    wait_for(all_done, timeout=60, what="every released job run again on v1")
    # Each worker's summary counts the attempts it put back in the queue, not as cancels.
    counted = {"released": 0, "cancelled": 0}
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log()
        for name in counted:
            counted[name] += int(re.findall(rf"\b{name}=(\d+)", worker.log())[-1])
    assert counted == {"released": JOBS, "cancelled": 0}, [w.log() for w in workers]

    runs: dict[int, list[dict[str, object]]] = defaultdict(list)
    for line in read_lines(side):
        runs[int(line["n"])].append(line)  # type: ignore[arg-type]
    for job_id in ids:
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.SUCCEEDED
        assert job.result == {"n": job.result["n"], "version": "v1"}
        assert job.handler_version == "v1"
        lines = sorted(runs[int(job.result["n"])], key=lambda item: float(item["t"]))  # type: ignore[arg-type]
        ends = [(line["event"], line["version"]) for line in lines if line["event"] != "step"]
        # v2 began, stopped, and only then did v1 run: never two versions at once.
        assert ends == [("start", "v2"), ("end", "v2"), ("start", "v1"), ("end", "v1")], lines
        steps = [line for line in lines if line["event"] == "step"]
        assert 0 < len(steps) < rollout_release.STEPS, "v2 was not stopped at a step boundary"

        events = app.trace(job_id)
        names = [e.name for e in events]
        assert "job.cancelled" not in names and "job.failed" not in names, names
        requested = [e for e in events if e.name == "job.release_requested"]
        released = [e for e in events if e.name == "job.released"]
        assert len(requested) == 1 and len(released) == 1, names
        assert requested[0].data["from_version"] == "v2"
        assert requested[0].data["to_version"] == "v1"
        assert released[0].data["from_version"] == "v2"
        assert released[0].data["to_version"] == "v1"
        assert released[0].status == "queued"
        assert len(released[0].data["committed_steps"]) == len(steps)
        leases = [(e.attempt, e.data["version"]) for e in events if e.name == "job.leased"]
        assert leases == [(1, "v2"), (2, "v1")], leases
        assert released[0].attempt == 1
        assert names.index("job.release_requested") < names.index("job.released")
        assert job.redelivery_count == 0

    history = app.rollout("slow").history()
    assert [c.action for c in history] == ["start", "rollback --release-inflight"]
    assert app.list_jobs(job_type="slow", states=["queued", "running"], version="v2") == []
