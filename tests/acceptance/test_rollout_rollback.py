"""The rollback drill of seed 004, with a live backlog across two real worker processes.

2,000 jobs drain at a 50 % ramp; halfway, ``rollout rollback`` is one switch. Then:
none is lost, none runs on two versions at once, every attempt's version is in its
trace (and is the version that really ran), every lease after the switch (and its
refresh) is v1, and the rollback adds no retries — each job retried exactly as its
own failure asked, and retries per second no higher after than before.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import rollout_drain

JOBS = 2000
REFRESH_SLACK = 1.0  # a worker sees a routing change within its 0.5 s refresh plus a lease


@pytest.mark.timeout(180)
def test_rollback_mid_backlog_loses_nothing_and_never_runs_a_job_on_two_versions(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    side = tmp_path / "runs.jsonl"
    env = {"ROLLOUT_SIDE_FILE": str(side)}
    app = rollout_drain.build(launcher.url)
    app.register_contracts()
    app.rollout("drain", actor="drill").start("v2", canary="50%", reason="ramp drill")
    ids = app.enqueue_many([replayq.EnqueueRequest("drain", {"n": n}) for n in range(JOBS)])
    for name in ("a", "b"):
        launcher.start(name, app="tests.apps.rollout_drain:app", concurrency=4, env=env)

    def succeeded() -> int:
        return len(app.list_jobs(job_type="drain", states=["succeeded"], limit=JOBS))

    wait_for(lambda: succeeded() >= JOBS // 2, timeout=90, what="half the backlog drained")
    result = CliRunner().invoke(
        main,
        [
            "--db",
            launcher.url,
            "rollout",
            "rollback",
            "drain",
            "--by",
            "drill",
            "--reason",
            "v2 misbehaves",
        ],
    )
    assert result.exit_code == 0, result.output
    switched = time.time()
    wait_for(lambda: succeeded() >= JOBS, timeout=120, what="the whole backlog drained")

    jobs = [app.get_job(i) for i in ids]
    assert all(job.state is replayq.JobState.SUCCEEDED for job in jobs), "a job was lost"

    runs: dict[int, list[dict[str, object]]] = defaultdict(list)
    for line in read_lines(side):
        runs[int(line["n"])].append(line)  # type: ignore[arg-type]
    for n, lines in runs.items():
        # One attempt at a time per job: each start is closed before the next one opens.
        open_attempt = None
        for line in sorted(lines, key=lambda item: float(item["t"])):  # type: ignore[arg-type]
            if line["event"] == "start":
                assert open_attempt is None, f"job n={n} ran twice at once: {lines}"
                open_attempt = line
            else:
                assert open_attempt is not None and open_attempt["version"] == line["version"]
                open_attempt = None

    leased_after = []
    for job in jobs:
        leases = [e for e in app.trace(job.id) if e.name == "job.leased"]
        ran = [
            (line["attempt"], line["version"])
            for line in runs[job.result["n"]]
            if line["event"] == "start"
        ]
        assert sorted((e.attempt, e.data["version"]) for e in leases) == sorted(ran), job.id
        leased_after += [e for e in leases if e.ts > switched + REFRESH_SLACK]
    assert leased_after, "the drill switched too late to test anything"
    assert {e.data["version"] for e in leased_after} == {"v1"}
    v2_before = [
        j
        for j in jobs
        if any(e.name == "job.leased" and e.data["version"] == "v2" for e in app.trace(j.id))
    ]
    assert v2_before, "the ramp never routed anything to v2"

    # No retry storm: every retry is the one each tenth job asks for, and the rate after the
    # switch is no higher than before it (allowing for the sampling noise of a 2 s window).
    retries = [e for job in jobs for e in app.trace(job.id) if e.name == "retry.scheduled"]
    assert len(retries) == JOBS // 10
    window = 2.0
    before = sum(1 for e in retries if switched - window <= e.ts < switched) / window
    after = sum(1 for e in retries if switched <= e.ts < switched + window) / window
    assert after <= before * 1.5 + 5, (before, after)

    history = app.rollout("drain").history()
    assert [c.action for c in history] == ["start", "rollback"]
    assert history[-1].actor == "drill" and history[-1].reason == "v2 misbehaves"
    still_v2 = app.list_jobs(job_type="drain", states=["queued", "running"], version="v2")
    assert still_v2 == []
