"""``async def`` handlers on a real worker subprocess, both backends: async jobs share the
worker's one event loop, and an awaited ``ctx.effect`` is made once per key and replays
without a real call (the counting HTTP service of tests/services.py is the proof)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from replayq.model import JobState
from tests.acceptance.workers import WorkerLauncher, read_lines
from tests.apps import async_jobs
from tests.replay_support import cli
from tests.services import Service

APP = "tests.apps.async_jobs:app"


@pytest.fixture
def app(launcher: WorkerLauncher) -> Iterator[replayq.App]:
    built = async_jobs.build(launcher.url)
    yield built
    built.close()


def test_four_async_jobs_awaiting_half_a_second_share_one_loop_and_finish_within_a_second(
    app: replayq.App, launcher: WorkerLauncher, side_file: Path
) -> None:
    ids = [app.enqueue("nap", {"log": str(side_file), "n": n, "seconds": 0.5}) for n in range(4)]

    launcher.start("w-async", app=APP, concurrency=4, burst=True).wait(60)

    assert {app.get_job(i).state for i in ids} == {JobState.SUCCEEDED}
    lines = read_lines(side_file)
    starts = [line["t"] for line in lines if line["event"] == "start"]
    ends = [line["t"] for line in lines if line["event"] == "end"]
    assert len(starts) == len(ends) == 4
    # Four 0.5 s awaits one after the other would take 2 s.
    assert max(ends) - min(starts) < 1.0, lines
    assert len({line["loop"] for line in lines}) == 1, "each async job ran on its own loop"
    assert len({line["thread"] for line in lines}) == 1, "async jobs ran on several threads"


def test_an_awaited_effect_runs_once_per_key_and_dry_runs_with_zero_real_calls(
    app: replayq.App, launcher: WorkerLauncher, service: Service
) -> None:
    # The first attempt's shipment request fails after the email went out: the retry
    # must find the email's record and not send it again.
    service.fail_next("/warehouse/shipments", times=1)
    first = app.enqueue("notify", {"order_id": 7})
    again = app.enqueue("notify", {"order_id": 7}, message_id="a second delivery")

    launcher.start("w-effects", app=APP, burst=True, options=("--burst-wait", "5")).wait(60)

    jobs = [app.get_job(first), app.get_job(again)]
    assert [j.state for j in jobs] == [JobState.SUCCEEDED, JobState.SUCCEEDED], jobs
    assert jobs[0].result == jobs[1].result == {"available": 10, "shipment": "shp-1"}
    assert service.counts()["/email"] == 1, "the awaited effect ran twice for one key"
    assert service.counts()["/warehouse/shipments"] == 2, "one refused, one made"
    assert service.counts()["/inventory/sku-1"] >= 2
    before = service.counts()

    replayed = cli(launcher.url, "replay", str(first), "--mode", "dry-run", "--app", APP)

    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "no divergence" in replayed.stdout
    assert service.counts() == before, "the dry-run of an async handler made real requests"
