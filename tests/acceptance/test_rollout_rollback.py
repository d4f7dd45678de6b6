"""The rollback drill of seed 004, with a live backlog across two real worker processes.

2,000 jobs drain at a 50 % ramp; halfway, ``rollout rollback`` is one switch. Then:
none is lost, none runs on two versions at once, every attempt's version is in its
trace (and is the version that really ran), every lease after the switch (and its
refresh) is v1, and the rollback adds no retries — each job retried exactly as its
own failure asked, none redelivered, and retries per second no higher after than
before at the same pace of work (the margin is the quantisation of "every tenth
job", derived where it is asserted).
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

    events = {job.id: app.trace(job.id) for job in jobs}
    leased_after = []
    for job in jobs:
        leases = [e for e in events[job.id] if e.name == "job.leased"]
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
        if any(e.name == "job.leased" and e.data["version"] == "v2" for e in events[j.id])
    ]
    assert v2_before, "the ramp never routed anything to v2"

    # No retry storm. First, no retry beyond the ones the jobs ask for: exactly one per
    # tenth job, at its first attempt, and no lease-expiry redelivery anywhere.
    retries = [e for trace in events.values() for e in trace if e.name == "retry.scheduled"]
    n_of = {job.id: job.result["n"] for job in jobs}
    assert sorted(n_of[e.job_id] for e in retries) == list(range(0, JOBS, 10))
    assert {e.attempt for e in retries} == {1}
    assert all(job.redelivery_count == 0 for job in jobs)
    # Then the rate: retries per second in the window after the switch no higher than in
    # the window before it, at the pace of work each window had. The shared machine's load,
    # not the rollback, moves how many first attempts end per second, so the count before
    # is scaled by ends_after / ends_before. The only margin is the quantisation of "every
    # tenth job": first attempts end in about id order, so a window in which L of them end
    # holds L/10 failing jobs, give or take one at each edge (at most 8 attempts run at
    # once, and 8 consecutive ids hold at most one multiple of 10): ±2 per window, i.e.
    # after ≤ L_after/10 + 2 and before ≥ L_before/10 - 2.
    window = 2.0
    first_ends = [
        e.ts
        for trace in events.values()
        for e in trace
        if e.attempt == 1 and e.name in ("job.succeeded", "retry.scheduled")
    ]

    def count(times: list[float], start: float) -> int:
        return sum(1 for t in times if start <= t < start + window)

    retry_times = [e.ts for e in retries]
    before, after = count(retry_times, switched - window), count(retry_times, switched)
    ends_before, ends_after = count(first_ends, switched - window), count(first_ends, switched)
    assert ends_before >= 20 and ends_after >= 20, "a window ran too little work to compare"
    pace = ends_after / ends_before
    assert after / window <= ((before + 2) * pace + 2) / window, (before, after, pace)

    history = app.rollout("drain").history()
    assert [c.action for c in history] == ["start", "rollback"]
    assert history[-1].actor == "drill" and history[-1].reason == "v2 misbehaves"
    still_v2 = app.list_jobs(job_type="drain", states=["queued", "running"], version="v2")
    assert still_v2 == []
