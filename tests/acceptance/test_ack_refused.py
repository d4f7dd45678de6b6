"""An ack refused by a unique key fails its own job, once; the others are acked, once.

``ship`` (``tests/apps/ack_refused.py``) inserts its order into the application's own
``shipments`` table outside any step (``ctx.db_write``): the insert commits with the
ack. One order is already there (another worker's shipment), so that job's ack is
refused by the table's primary key every time it is tried: a refusal, not an outage.

Before, the worker tried the whole group again five times and then gave every ack of it
up: the good jobs stayed ``running``, were reaped after their lease and ran again, and
the bad one ran again, was refused again and given up again, without end. Now the group
is split so the good acks commit, and the refused one is the attempt's failure (class
``validation``): ``dead`` with the constraint named, never run again. The same for a
job acked on its own (a routed type's successes are not grouped).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import ack_refused

APP = "tests.apps.ack_refused:app"
ORDERS = (1, 2, 3, 4, 5, 6)
BAD = 4
# Longer than a lease (2 s) and the reaper's look after it: a job given up would be
# reaped and run again within it.
QUIET = 5.0


def _constraint_named(backend: str) -> str:
    # The constraint as each database names it in its refusal.
    if backend == "sqlite":
        return "UNIQUE constraint failed: shipments.order_id"
    return 'unique constraint "shipments_pkey"'


def _run(launcher: WorkerLauncher, tmp_path: Path, *, routed: bool) -> tuple[str, ...]:
    side = tmp_path / "runs.jsonl"
    env = {"ACK_REFUSED_SIDE_FILE": str(side)}
    app = ack_refused.build(launcher.url)
    try:
        ack_refused.create_table(app)
        ack_refused.ship_elsewhere(app, BAD)
        if routed:
            # Every job stays on v1; the type has routing, so each success is acked alone.
            app.rollout("ship", actor="test").start("v2", canary="0%", reason="acked alone")
        ids = {order: app.enqueue("ship", {"order": order}) for order in ORDERS}
        # One executor, every job leased in one batch, acks held up to 5 s: the six acks
        # are one group (unless routed), committed once the executor has nothing left.
        worker = launcher.start(
            "w1",
            app=APP,
            env=env,
            options=("--prefetch", "8", "--prefetch-window", "inf", "--ack-window", "5"),
        )

        def settled() -> bool:
            return all(
                app.get_job(job_id).state in (replayq.JobState.SUCCEEDED, replayq.JobState.DEAD)
                for job_id in ids.values()
            )

        wait_for(settled, timeout=60, what="every job to settle")
        time.sleep(QUIET)

        runs = Counter(line["order"] for line in read_lines(side))
        assert runs == dict.fromkeys(ORDERS, 1), runs  # each ran once: no re-run, no reap
        for order, job_id in ids.items():
            job = app.get_job(job_id)
            if order != BAD:
                assert (job.state, job.last_error) == (replayq.JobState.SUCCEEDED, None)
                assert job.handler_version == "v1"
                continue
            assert job.state is replayq.JobState.DEAD, (job.state, job.last_error)
            assert job.dead_reason == "not_retryable"
            assert job.last_error_class == "validation"
            assert job.attempt == 1
            assert job.last_error is not None
            assert "ConstraintViolationError" in job.last_error, job.last_error
            assert _constraint_named(launcher.backend) in job.last_error, job.last_error
            names = [e.name for e in app.trace(job_id)]
            assert "job.dead" in names and "write.rejected" not in names, names
        # Each good job's row once, the bad one's never (the row is the other worker's).
        assert ack_refused.shipped(app) == sorted(ORDERS)
        assert worker.proc.poll() is None, worker.log()  # the worker runs on
        return tuple(worker.log().splitlines())
    finally:
        app.close()


def test_a_group_whose_ack_a_unique_key_refuses_acks_the_others_and_fails_that_job_once(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    log = _run(launcher, tmp_path, routed=False)
    # The acks were one group, split to leave the refused one out.
    assert any("committed in halves" in line for line in log), "\n".join(log)


def test_an_ack_alone_that_a_unique_key_refuses_fails_that_job_once(
    launcher: WorkerLauncher, tmp_path: Path
) -> None:
    log = _run(launcher, tmp_path, routed=True)
    assert not any("committed in halves" in line for line in log), "\n".join(log)
