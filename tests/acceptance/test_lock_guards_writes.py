"""Two workers contend for one lock around writes to other entities.

Each job takes ``warehouse:1`` inside its step, reads the stock, writes it and its own
``order:N``, lets go of the lock and runs on in the step (its writes not committed yet)
until the other worker holds the lock, or a second passes (``tests/apps/warehouse_lock``).
The lock must guard those writes until they commit: its release commits with them, so the
other worker cannot take it meanwhile, read the stock about to change, and get the first
one's commit rejected (``StaleFencingTokenError``: a reservation lost).
"""

from __future__ import annotations

import replayq
from replayq.model import TERMINAL_STATES
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import warehouse_lock

APP = "tests.apps.warehouse_lock:app"
ORDERS = 4
STOCK = 100


def test_a_lock_let_go_of_guards_its_writes_until_they_commit(launcher: WorkerLauncher) -> None:
    app = warehouse_lock.build(launcher.url)
    try:
        app.state.put("stock", 1, {"units": STOCK}, expected_version=0)
        ids = [app.enqueue("reserve", {"order": n, "hold": 1.0}) for n in range(ORDERS)]
        launcher.start("w1", app=APP)
        launcher.start("w2", app=APP)

        def settled() -> list[replayq.Job] | None:
            jobs = [app.get_job(job_id) for job_id in ids]
            return jobs if all(job.state in TERMINAL_STATES for job in jobs) else None

        jobs = wait_for(settled, timeout=60, what="every reservation to settle")
        assert [(job.state, job.last_error) for job in jobs] == [
            (replayq.JobState.SUCCEEDED, None)
        ] * ORDERS, "no reservation rejected by fencing"
        assert {job.worker_id for job in jobs} == {"w1", "w2"}, "both workers contended"

        # Nothing lost: each reservation read the stock the one before it left.
        assert app.state.get("stock", 1).data == {"units": STOCK - ORDERS}
        before = sorted(app.state.get("order", n).data["stock_before"] for n in range(ORDERS))
        assert before == list(range(STOCK - ORDERS + 1, STOCK + 1))
        for job in jobs:
            names = [e.name for e in app.trace(job.id) if e.kind == "domain"]
            assert "state.write_rejected" not in names, names
            # The release waited for the step's commit and committed with it: in the order
            # the handler let go of the lock, before the step's end.
            assert names.index("lock.released") < names.index("step.finished"), names
    finally:
        app.close()
