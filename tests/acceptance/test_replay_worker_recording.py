"""A job recorded by a real worker process replays, forks and diffs from another process, and the
real service it called sees nothing of it."""

from __future__ import annotations

import json

import replayq
from replayq.model import JobState
from tests.acceptance.workers import WorkerLauncher
from tests.apps import replay_shop
from tests.replay_support import APP_SPEC, cli, cli_ok
from tests.services import Service


def test_job_recorded_by_a_worker_process_replays_without_touching_the_service(
    launcher: WorkerLauncher, service: Service
) -> None:
    app = replay_shop.declare(replayq.App(launcher.url))
    try:
        replay_shop.seed_order(app, 1)
        job_id = app.enqueue("ship_order", {"order_id": 1})
        worker = launcher.start("recorder", app=APP_SPEC, burst=True)
        assert worker.wait(30) == 0, worker.log()
        job = app.get_job(job_id)
        assert job.state == JobState.SUCCEEDED, job.last_error
        recorded = service.counts()
        assert recorded == {"/inventory/sku-1": 1, "/warehouse/shipments": 1, "/email": 1}

        same = cli(launcher.url, "replay", str(job_id), "--mode", "dry-run", "--app", APP_SPEC)
        flipped = cli(
            launcher.url,
            *("replay", str(job_id), "--mode", "dry-run", "--version", "v2", "--app", APP_SPEC),
        )
        forked = json.loads(
            cli_ok(
                launcher.url,
                *("fork", str(job_id), "--from-step", "decide", "--version", "v2"),
                # v2 backorders and emails under a key the recording lacks: stub it.
                *("--stub", 'email.send={"message_id": "stub"}'),
                *("--app", APP_SPEC, "--json"),
            ).stdout
        )
        diff = json.loads(
            cli_ok(launcher.url, "diff", str(job_id), forked["trace_id"], "--json").stdout
        )

        assert service.counts() == recorded, "a replay process reached the real service"
        assert same.returncode == 0, same.stdout + same.stderr
        assert flipped.returncode == 1, flipped.stdout + flipped.stderr
        assert "FIRST DIVERGENCE at step 'decide'" in flipped.stdout
        assert forked["outcome_now"]["result"] == {"status": "backordered", "shipment_id": None}
        assert {row["field"] for row in diff["state"]} == {"status", "shipment_id"}
        assert app.get_job(job_id).state == JobState.SUCCEEDED
        assert app.state.get("order", 1).data["status"] == "shipped"
    finally:
        app.close()
