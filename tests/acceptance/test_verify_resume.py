"""``rollout verify --background``: a verification killed halfway resumes where it stopped.

A real worker process runs the ``replayq.verify`` job; it is SIGKILLed after some
chunks committed and before the last. Another worker takes the job over when its
lease expires. Then: the final report is the report of an uninterrupted run (the
same attempts, counts, histogram and examples), and no chunk that committed
before the kill ran again (each chunk's step finished once; the resumed attempt
skipped them).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli.main import main
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import verify_resume

JOBS = 300
CHUNK = 20
APP = "tests.apps.verify_resume:app"


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its timings (which differ from run to run)."""
    body = {k: v for k, v in report.items() if k not in ("seconds", "attempts_per_second")}
    body["examples"] = [
        {k: v for k, v in example.items() if k != "duration_now"} for example in body["examples"]
    ]
    return body


@pytest.mark.timeout(240)
def test_a_verification_killed_halfway_resumes_and_ends_with_the_uninterrupted_report(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    app = verify_resume.build(launcher.url)
    app.enqueue_many([replayq.EnqueueRequest("score", {"n": n}) for n in range(JOBS)])
    stats = replayq.Worker(app, concurrency=4, burst=True).run()
    assert (stats.succeeded, stats.dead) == (JOBS - JOBS // 5, JOBS // 5)

    uninterrupted = replayq.verify_rollout(app, "score", from_version="v1", to_version="v2")
    assert uninterrupted.counts["retry_decision"] == JOBS // 5

    cli = CliRunner()
    started = cli.invoke(
        main,
        ["--db", launcher.url, "rollout", "verify", "score", "--app", APP,
         "--from", "v1", "--to", "v2", "--background", "--chunk", str(CHUNK), "--json"],
    )  # fmt: skip
    assert started.exit_code == 0, started.output
    job_id = int(json.loads(started.output)["job_id"])

    first = launcher.start("first", app=APP)
    chunks = JOBS // CHUNK
    killed_after = wait_for(
        lambda: (run := replayq.verify_run(app, job_id)).chunks_done >= 3 and run,
        timeout=90,
        what="three chunks committed",
        interval=0.01,
    ).chunks_done
    first.signal(signal.SIGKILL)
    first.wait(10)
    at_kill = replayq.verify_run(app, job_id)
    assert not at_kill.finished and at_kill.chunks_done < chunks, "killed too late to test"
    assert at_kill.done == at_kill.chunks_done * CHUNK and at_kill.total == JOBS

    launcher.start("second", app=APP)
    final = wait_for(
        lambda: (run := replayq.verify_run(app, job_id)).finished and run,
        timeout=120,
        what="the verification finished on the second worker",
    )
    assert final.attempt >= 2, "the job was not taken over after the kill"
    assert _comparable(app.get_job(job_id).result) == _comparable(uninterrupted.to_dict())
    # Read back, its fork commands name the --app it was started with.
    uninterrupted.point_forks_at(APP)
    assert _comparable(final.report.to_dict()) == _comparable(uninterrupted.to_dict())

    # No committed chunk ran again: each chunk step finished with success exactly once,
    # and the resumed attempt skipped every chunk that had committed before the kill.
    events = app.trace(job_id)
    finished = [
        e.data["step_name"]
        for e in events
        if e.name == "step.finished" and e.status == "success"
        and str(e.data["step_name"]).startswith("chunk ")
    ]  # fmt: skip
    assert sorted(finished) == sorted(f"chunk {i + 1}" for i in range(chunks))
    skipped = {e.data["step_name"] for e in events if e.name == "step.skipped"}
    assert {f"chunk {i + 1}" for i in range(killed_after)} <= skipped

    shown = cli.invoke(main, ["--db", launcher.url, "rollout", "verify-status", str(job_id)])
    assert shown.exit_code == 1, shown.output  # finished, with findings (retry_decision)
    assert f"{JOBS}/{JOBS} attempts" in shown.output and "retry_decision" in shown.output
    status = cli.invoke(main, ["--db", launcher.url, "rollout", "status", "score", "--json"])
    assert status.exit_code == 0, status.output
    [listed] = json.loads(status.output)["verify_runs"]
    assert listed["job_id"] == job_id and listed["finished"]
