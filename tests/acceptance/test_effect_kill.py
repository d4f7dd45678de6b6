"""A worker SIGKILLed inside ``ctx.effect`` leaves the effect in doubt, never done twice.

The kill lands between the idempotency claim and the recorded result: the effect may
have happened. Under the default ``park`` policy the next attempt must not run it
again; it parks the job (``dead``, reason ``effect_in_doubt``) for a human to check
the real world. Checked from outside: the job row, the idempotency record and the
file the effect itself appends to.
"""

from __future__ import annotations

import signal
from pathlib import Path

import replayq
from replayq.storage.protocol import idem_get
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import effect_kill

APP = "tests.apps.effect_kill:app"


def test_sigkill_inside_an_effect_parks_the_job_in_doubt_and_the_effect_ran_once(
    launcher: WorkerLauncher, side_file: Path
) -> None:
    app = effect_kill.build(launcher.url)
    try:
        job_id = app.enqueue("charge", {"n": 1, "sink": str(side_file)})
        doomed = launcher.start("doomed", app=APP, env={"EFFECT_KILL_SECONDS": "60"})
        wait_for(lambda: read_lines(side_file), timeout=20, what="the effect to start")

        doomed.signal(signal.SIGKILL)  # inside the effect: claimed, no result recorded
        doomed.wait(10)
        with app.storage.transaction(readonly=True) as tx:
            record = idem_get(tx, "charge:1:ledger.charge")
        assert record is not None and record.status == "started"
        assert (record.job_id, record.attempt) == (job_id, 1)

        launcher.start("survivor", app=APP)
        finished = {replayq.JobState.DEAD, replayq.JobState.SUCCEEDED}
        job = wait_for(
            lambda: (j := app.get_job(job_id)).state in finished and j,
            timeout=30,
            what="the job to finish after the kill",
        )

        assert job.state is replayq.JobState.DEAD, "parked: a human checks the real world"
        assert job.dead_reason == "effect_in_doubt"
        assert job.attempt == 2 and job.redelivery_count == 1
        assert [line["event"] for line in read_lines(side_file)] == ["effect"], (
            "the effect ran once: the survivor must not run an effect that may have happened"
        )
        with app.storage.transaction(readonly=True) as tx:
            after = idem_get(tx, "charge:1:ledger.charge")
        assert after is not None and after.status == "started", "still in doubt, not guessed"
        events = [(e.name, e.worker_id, e.attempt) for e in app.trace(job_id)]
        assert ("effect.claimed", "doomed", 1) in events
        assert ("effect.in_doubt", "survivor", 2) in events
        assert ("job.dead", "survivor", 2) in events
        assert not [name for name, _, _ in events if name == "effect.succeeded"]
    finally:
        app.close()
