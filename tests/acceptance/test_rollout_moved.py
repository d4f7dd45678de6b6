"""A plain ``rollout rollback`` under a running v2 attempt, with a real worker process: the
attempt finishes on v2 (the switch cuts no lease short), and when it fails its retry runs
on v1, its ``job.leased`` saying ``version_moved_from: v2`` (docs/rollout.md, "Rollback")."""

from __future__ import annotations

from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import rollout_moved


def test_a_v2_attempt_running_at_the_rollback_ends_on_v2_and_its_retry_runs_on_v1(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    side, go = tmp_path / "runs.jsonl", tmp_path / "go"
    app = rollout_moved.build(launcher.url)
    try:
        app.register_contracts()
        app.rollout("quote", actor="drill").start("v2", canary="100%", reason="drill")
        job_id = app.enqueue("quote", {"n": 1})
        env = {"ROLLOUT_SIDE_FILE": str(side), "ROLLOUT_GO": str(go)}
        launcher.start("w", app="tests.apps.rollout_moved:app", env=env)
        wait_for(lambda: read_lines(side), timeout=20, what="the v2 attempt to start")

        result = app.rollout("quote", actor="drill").rollback(reason="v2 fails")
        assert result.in_flight == 1, result
        assert app.get_job(job_id).state is replayq.JobState.RUNNING, "its lease is not cut"
        go.touch()
        settled = (replayq.JobState.SUCCEEDED, replayq.JobState.DEAD)
        wait_for(lambda: app.get_job(job_id).state in settled, timeout=20, what="the job to settle")

        runs = [(x["event"], x["version"], x["attempt"]) for x in read_lines(side)]
        assert runs == [
            ("start", "v2", 1), ("end", "v2", 1), ("start", "v1", 2), ("end", "v1", 2),
        ], "v2 finished its attempt; the retry ran on v1, after it"  # fmt: skip
        leases = [e for e in app.trace(job_id) if e.name == "job.leased"]
        assert [(e.attempt, e.data["version"]) for e in leases] == [(1, "v2"), (2, "v1")]
        assert "version_moved_from" not in leases[0].data
        assert leases[1].data["version_moved_from"] == "v2"
        assert app.get_job(job_id).result == {"n": 1, "version": "v1"}
    finally:
        app.close()
