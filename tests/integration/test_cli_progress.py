"""Progress bars on long CLI work (bulk rerun, bulk requeue): on a terminal, never in --json.

Real ``replayq`` processes; ``TTY_COMPATIBLE=1`` makes rich treat the captured
output as a terminal, the way it would draw for an operator.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import replayq
from tests.acceptance.workers import run_cli
from tests.apps import observed


def run(url: str, *args: str, terminal: bool) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": "100", **({"TTY_COMPATIBLE": "1"} if terminal else {})}
    done = run_cli(url, *args, env=env, unset=("TTY_COMPATIBLE", "NO_COLOR"))
    assert done.returncode == 0, done.stderr
    return done


def test_bulk_rerun_draws_a_bar_on_a_terminal_and_keeps_json_clean(sqlite_url: str) -> None:
    app = observed.declare(replayq.App(sqlite_url, auto_migrate=True))
    for order_id in (1, 2, 3):
        app.enqueue("notify", {"order_id": order_id})
    replayq.Worker(app, burst=True).run()
    rerun = (
        "rerun",
        "--app",
        "tests.apps.observed:app",
        "--type",
        "notify",
        "--state",
        "succeeded",
        "--allow-effects",
        "mail.send",
        "--yes",
    )

    as_json = run(sqlite_url, *rerun, "--json", terminal=True)
    reports = json.loads(as_json.stdout)  # nothing but the document
    assert sorted(r["job_id"] for r in reports) == [1, 2, 3]
    assert "━" not in as_json.stdout + as_json.stderr

    shown = run(sqlite_url, *rerun, terminal=True)
    assert "rerun" in shown.stdout and "100%" in shown.stdout and "━" in shown.stdout
    assert shown.stdout.count("job ") == 3
    app.close()


def test_requeue_of_a_selection_draws_a_bar_and_one_by_id_does_not(
    sqlite_url: str, tmp_path: Path
) -> None:
    app = observed.declare(replayq.App(sqlite_url, auto_migrate=True))
    dead = [app.enqueue("doomed", {"reason": f"order {n} not paid"}) for n in range(3)]
    replayq.Worker(app, burst=True).run()
    assert {app.get_job(j).state for j in dead} == {"dead"}

    one = run(sqlite_url, "dead", "requeue", str(dead[0]), "--reason", "fixed", terminal=True)
    assert one.stdout.strip() == f"job {dead[0]} requeued"
    replayq.Worker(app, burst=True).run()

    many = run(
        sqlite_url, "dead", "requeue", "--type", "doomed", "--reason", "fixed", terminal=True
    )
    assert "requeue" in many.stdout and "100%" in many.stdout
    assert {app.get_job(j).state for j in dead} == {"queued"}
    app.close()
