"""A real worker's log lines for successes, retries and burials (``--log-format json``).

Successes are logged once per commit: a job acked on its own as ``job 7 succeeded in
0.012s``, a group commit's as one ``N jobs succeeded (one group commit): …`` line naming
each job (and, written outside any attempt, carrying no ``job_id``). However the acks
happen to group, each success is named exactly once; each retry and each burial keeps
a line of its own with the job's fields.
"""

from __future__ import annotations

import json
import re

import replayq
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import metered

ONE = re.compile(r"job (\d+) succeeded in \d+\.\d{3}s")
GROUP = re.compile(r"(\d+) jobs succeeded \(one group commit\): (.*)")


def test_each_success_is_named_once_and_each_retry_and_burial_has_its_line(
    launcher: WorkerLauncher,
) -> None:
    app = metered.declare(replayq.App(launcher.url))
    try:
        children = [app.enqueue("child", {"order_id": n}) for n in range(40)]
        wobbly = app.enqueue("wobbly", {"n": 1})
        worn_out = app.enqueue("worn_out", {})
        worker = launcher.start(
            "w1", app="tests.apps.metered:app", concurrency=4, options=("--log-format", "json")
        )

        def settled() -> bool:
            done = {app.get_job(j).state for j in children} == {"succeeded"}
            return done and (app.get_job(wobbly).state, app.get_job(worn_out).state) == (
                "succeeded",
                "dead",
            )

        wait_for(settled, timeout=60, what=f"every job settled\n{worker.log()}")
        worker.proc.terminate()  # a graceful stop: every line written before it exits
        assert worker.proc.wait(30) == 0, worker.log()
    finally:
        app.close()
    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]

    named: list[int] = []
    for record in records:
        message = record["message"]
        if one := ONE.fullmatch(message):
            named.append(int(one.group(1)))
        elif group := GROUP.fullmatch(message):
            ids = [int(part.split(" in ")[0]) for part in group.group(2).split(", ")]
            assert len(ids) == int(group.group(1)) > 1, message
            assert "job_id" not in record, "a group's line is about no one job"
            named.extend(ids)
    assert sorted(named) == sorted([*children, wobbly]), "each success named exactly once"

    retries = [
        r
        for r in records
        if re.match(rf"job {wobbly} failed \(transient\), retrying", r["message"])
    ]
    assert [r["attempt"] for r in retries] == [1, 2]
    assert {r["job_id"] for r in retries} == {wobbly}
    lines = [
        r for r in records if r.get("job_id") == worn_out and r["level"] in ("warning", "error")
    ]
    assert [r["message"].split(":")[0] for r in lines] == [
        f"job {worn_out} failed (transient), retrying",
        f"job {worn_out} failed (transient), retrying",
        f"job {worn_out} failed (transient), dead",
    ]
