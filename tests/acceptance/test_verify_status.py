"""``rollout verify-status``: a background verification is no pass until it has finished.

A script gates a ramp on ``replayq rollout verify-status JOB``: exit 0 and
``"passed": true`` must mean a finished verification that found nothing. Here the
verifications are started and read by real ``replayq`` processes and run by real
worker processes, and each is read at every stage of its life: queued (no worker
has compared anything), running (a worker SIGSTOPped after two chunks committed,
with nothing found so far), after that worker's SIGKILL (still running, to the
database), and finished on a second worker. Until then it is exit 5 and
``passed: null``; a cancelled one, which never will finish, is exit 1 and ``passed:
false``. The fork commands of a finished report name the ``--app`` the verification
was started with, and one started without says to add it. The dashboard shows the
same verdicts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, run_cli, wait_for
from tests.apps import dashboard_shop, verify_resume
from tests.browser.conftest import start_dashboard

JOBS = 300
APP = "tests.apps.verify_resume:app"
# verify-status's exit codes (docs/reliability.md).
PASSED, FINDINGS, UNFINISHED = 0, 1, 5


def _status(url: str, job_id: int) -> tuple[int, dict[str, Any]]:
    """``verify-status JOB --json`` in its own process: exit code and the JSON."""
    shown = run_cli(url, "rollout", "verify-status", str(job_id), "--json")
    assert shown.stdout, shown.stderr
    return shown.returncode, json.loads(shown.stdout)


def _start(url: str, *args: str) -> int:
    started = run_cli(url, "rollout", "verify", "score", "--app", APP, "--background", *args)
    assert started.returncode == 0, started.stderr
    return int(json.loads(started.stdout)["job_id"])


def _assert_no_verdict(url: str, job_id: int, state: str) -> dict[str, Any]:
    code, body = _status(url, job_id)
    assert body["state"] == state
    # Before: exit 0 and the report's "passed": true, with nothing (or part) compared.
    assert (code, body["report"]["passed"]) == (UNFINISHED, None), body
    assert (body["passed"], body["verdict"]) == (None, "unfinished")
    text = run_cli(url, "rollout", "verify-status", str(job_id))
    assert text.returncode == UNFINISHED and "no verdict yet" in text.stdout, text.stdout
    return body


@pytest.mark.timeout(300)
def test_verify_status_gives_no_pass_before_the_verification_finished(
    launcher: WorkerLauncher,
) -> None:
    url = launcher.url
    app = verify_resume.build(url)
    app.enqueue_many([replayq.EnqueueRequest("score", {"n": n}) for n in range(JOBS)])
    stats = replayq.Worker(app, concurrency=4, burst=True).run()
    assert (stats.succeeded, stats.dead) == (JOBS - JOBS // 5, JOBS // 5)

    # v1 over its own history finds nothing, slowly (--rate): stopped while it runs.
    same = _start(url, "--from", "v1", "--to", "v1", "--chunk", "20", "--rate", "50", "--json")
    # v2 retries what v1 buried: findings, with examples and their fork commands.
    differs = _start(url, "--from", "v1", "--to", "v2", "--sample", "20", "--json")
    # Started through the API without an app: its fork commands cannot name one.
    no_app = replayq.start_verify(app, "score", from_version="v1", to_version="v2", sample=20)

    queued = _assert_no_verdict(url, same, "queued")
    assert queued["attempt"] == 0 and queued["done"] == 0 and queued["app"] == APP
    listed = run_cli(url, "rollout", "status", "score", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [run["passed"] for run in json.loads(listed.stdout)["verify_runs"]] == [None] * 3

    first = launcher.start("first", app=APP)
    wait_for(
        lambda: replayq.verify_run(app, same).chunks_done >= 2,
        timeout=120,
        what="two chunks committed",
        interval=0.01,
    )
    first.signal(signal.SIGSTOP)
    assert not replayq.verify_run(app, same).finished, "stopped too late to test"
    running = _assert_no_verdict(url, same, "running")
    assert running["done"] >= 40 and running["report"]["counts"] == {}  # nothing found so far

    first.signal(signal.SIGKILL)
    first.wait(10)
    _assert_no_verdict(url, same, "running")  # its lease has not expired yet

    launcher.start("second", app=APP)
    for job_id in (same, differs, no_app):
        wait_for(
            lambda job_id=job_id: replayq.verify_run(app, job_id).finished,
            timeout=180,
            what=f"verification {job_id} finished on the second worker",
        )

    code, body = _status(url, same)
    assert (code, body["passed"], body["report"]["passed"]) == (PASSED, True, True), body
    assert body["verdict"] == "passed" and body["attempt"] >= 2 and body["done"] == JOBS

    code, body = _status(url, differs)
    assert (code, body["passed"], body["verdict"]) == (FINDINGS, False, "findings"), body
    forks = [example["fork_command"] for example in body["report"]["examples"]]
    assert forks and all(fork.endswith(f"--app {APP}") for fork in forks), forks
    text = run_cli(url, "rollout", "verify-status", str(differs))
    assert text.returncode == FINDINGS and f"--app {APP}" in text.stdout, text.stdout
    assert "MODULE:APP" not in text.stdout

    text = run_cli(url, "rollout", "verify-status", str(no_app))
    assert text.returncode == FINDINGS, text.stdout
    assert "--app MODULE:APP" in text.stdout and "started without --app" in text.stdout

    listed = run_cli(url, "rollout", "status", "score", "--json")
    by_id = {run["job_id"]: run["passed"] for run in json.loads(listed.stdout)["verify_runs"]}
    assert by_id == {same: True, differs: False, no_app: False}
    assert run_cli(url, "rollout", "verify-status", "--type", "score").returncode == 0


def test_a_cancelled_verification_is_no_pass_and_not_worth_waiting_for(
    launcher: WorkerLauncher,
) -> None:
    url = launcher.url
    job_id = _start(url, "--from", "v1", "--to", "v2", "--json")
    cancelled = run_cli(url, "jobs", "cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr

    code, body = _status(url, job_id)
    assert (code, body["state"], body["report"]["passed"]) == (FINDINGS, "cancelled", False), body
    assert (body["passed"], body["verdict"]) == (False, "no_report")
    text = run_cli(url, "rollout", "verify-status", str(job_id))
    assert text.returncode == FINDINGS and "NO REPORT" in text.stdout, text.stdout


def _verify_cells(html: str, job_id: int) -> str:
    """The verify-runs table row of ``job_id``, as the page's HTML."""
    start = html.index(f'<td><a href="/jobs/{job_id}">{job_id}</a></td>')
    return html[start : html.index("</tr>", start)]


def test_the_dashboard_shows_no_verdict_before_a_verification_finished(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    url = launcher.url
    app = dashboard_shop.declare(replayq.App(url))
    for order_id in range(1, 6):
        app.state.put("order", order_id, {"status": "paid"}, expected_version=0)
    app.enqueue_many([replayq.EnqueueRequest("ship_order", {"order_id": n}) for n in range(1, 6)])
    replayq.Worker(app, burst=True).run()

    def start() -> int:
        started = run_cli(
            url, "rollout", "verify", "ship_order", "--app", "tests.apps.dashboard_shop:app",
            "--from", "v1", "--to", "v2", "--background", "--json",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        return int(json.loads(started.stdout)["job_id"])

    finished = start()
    launcher.start("worker", app="tests.apps.dashboard_shop:app", burst=True).wait(60)
    queued, cancelled = start(), start()
    assert run_cli(url, "jobs", "cancel", str(cancelled)).returncode == 0

    web = start_dashboard(url, tmp_path, token=None)
    try:
        with urllib.request.urlopen(web.url + "/rollout", timeout=30) as page:  # noqa: S310 -- http://127.0.0.1 only
            html = page.read().decode()
    finally:
        web.proc.terminate()
        try:
            web.proc.wait(10)
        except subprocess.TimeoutExpired:
            web.proc.kill()
    assert "not finished: no verdict yet" in _verify_cells(html, queued)
    assert "no report (cancelled)" in _verify_cells(html, cancelled)
    assert _verify_cells(html, finished).rstrip().endswith('class="changed">failed</td>')
    assert "--app tests.apps.dashboard_shop:app" in html and "MODULE:APP" not in html
