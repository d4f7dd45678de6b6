"""A key template naming a defaulted field, held by a real worker process
(``tests/apps/key_defaults``; docs/contracts.md, "Key templates").

Two jobs whose payloads differ only in leaving out a field the handler defaults
(``{"order_id": 2}`` and ``{"order_id": 2, "tenant": "a"}``) are one idempotency key,
one ordering key and one lock: the worker runs the effect once, and the second job
gets the first's result (the field rendered as ``None``: two keys, two charges).
"""

from __future__ import annotations

from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines
from tests.apps import key_defaults

APP = "tests.apps.key_defaults:app"


def test_a_left_out_defaulted_field_is_one_key_and_one_effect_on_a_worker(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = key_defaults.build(launcher.url)
    try:
        ids = [
            app.enqueue("charge", {"log": str(side_file), "n": n, "order_id": 2, **tenant})
            for n, tenant in enumerate([{}, {"tenant": "a"}])
        ]

        worker = launcher.start("burst", app=APP, burst=True)
        assert worker.wait(timeout=60) == 0, worker.log()

        jobs = [app.get_job(i) for i in ids]
        assert [job.state for job in jobs] == [replayq.JobState.SUCCEEDED] * 2
        assert [line["n"] for line in read_lines(side_file)] == [0], "one charge for one key"
        assert [job.result for job in jobs] == [{"charged_by": 0}] * 2
        assert {(job.idempotency_key, job.ordering_key) for job in jobs} == {
            ("charge:2:a", "order:2:a")
        }
        keys = {e.data["key"] for i in ids for e in app.trace(i) if e.data.get("key")}
        assert keys == {"charge:2:a:ledger.charge"}
    finally:
        app.close()
