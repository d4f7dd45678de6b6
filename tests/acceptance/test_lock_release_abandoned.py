"""A lock whose release waited for a commit that never came is released at once.

``ship`` (``tests/apps/lock_abandoned.py``) writes under ``shelf:1`` outside any step and
lets go of the lock: the release waits for the ack, after the writes it guarded. The
ack's commit is refused for real: the handler's insert into the application's own table
names a column the table does not have yet (not a constraint, which would fail the
attempt at once, nor the database being away), every try of the group commit fails the
same way, and the worker gives the ack up (the job stays running until its lease runs
out, as documented). The lock must not stay held until its 60 s TTL: it
is released then, in a statement of its own on its owner token, and traced once. A
``take`` job on another worker, asking the lock with ``wait=20s``, gets it within
seconds. Before, it waited out its 20 s and failed with ``LockTimeoutError``.
"""

from __future__ import annotations

import time

import replayq
from replayq.storage.protocol import lock_get
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import lock_abandoned

APP = "tests.apps.lock_abandoned:app"
ORDER = 7


def test_a_release_waiting_for_an_ack_given_up_is_made_at_once(
    launcher: WorkerLauncher,
) -> None:
    app = lock_abandoned.build(launcher.url)
    try:
        lock_abandoned.create_table(app)
        shipped = app.enqueue("ship", {"order": ORDER})
        launcher.start("w1", app=APP)

        def ship_holds() -> str | None:
            with app.storage.transaction(readonly=True) as tx:
                row = lock_get(tx, lock_abandoned.SHELF)
            return row.owner_token if row is not None and row.job_id == shipped else None

        wait_for(ship_holds, timeout=30, what="ship to take the shelf's lock")
        asked = time.monotonic()
        taken = app.enqueue("take", {"wait": 20.0})
        launcher.start("w2", app=APP)

        def take_settled() -> replayq.Job | None:
            job = app.get_job(taken)
            return job if job.state.value in ("succeeded", "dead") else None

        job = wait_for(take_settled, timeout=40, what="take to settle")
        took = time.monotonic() - asked
        assert (job.state, job.last_error) == (replayq.JobState.SUCCEEDED, None), job.last_error
        assert took < 15, f"the lock was taken {took:.1f}s after it was asked (TTL 60 s)"

        # The ship job's ack never committed: it is still running (reaped after its lease),
        # its writes never landed, and its lock's release is in its trace once.
        assert app.get_job(shipped).state is replayq.JobState.RUNNING
        assert app.state.get("order", ORDER).version == 0
        names = [
            e.name
            for e in app.trace(shipped)
            if e.resource == lock_abandoned.SHELF and e.name.startswith("lock.")
        ]
        assert names == ["lock.acquired", "lock.released"], names
        fences = {
            e.job_id: e.data["fencing_token"]
            for job_id in (shipped, taken)
            for e in app.trace(job_id)
            if e.name == "lock.acquired"
        }
        assert fences[taken] == fences[shipped] + 1, fences
    finally:
        app.close()
