"""``async def`` handlers record, replay and are sealed like sync ones (both backends).

The awaited ``ctx.call`` reaches the real counting service live and is answered
from the recording in a dry-run; the direct request the handler makes bypassing
``ctx`` is refused under the seal and reported with its step, live (``seal=True``)
and in a dry-run.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import replayq
from replayq.model import JobState
from replayq.testing import run_inline
from tests.apps import async_jobs
from tests.replay_support import derived_events
from tests.services import Service

AppFactory = Callable[..., replayq.App]


@pytest.fixture
def app(app_factory: AppFactory, service: Service) -> replayq.App:
    return async_jobs.build_on(app_factory())


def test_an_awaited_call_is_recorded_live_and_answered_from_the_recording_in_a_dry_run(
    app: replayq.App, service: Service
) -> None:
    job = run_inline(app, "peek", {"sku": "sku-1"})
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert service.counts() == {"/inventory/sku-1": 2}  # the recorded call and the direct one
    calls = [e for e in app.trace(job.id) if e.name == "call"]
    assert [(e.data["call"], e.data["response"]) for e in calls] == [
        ("inventory.get", {"sku": "sku-1", "available": 10})
    ]

    report = replayq.dry_run(app, job.id)

    assert service.counts() == {"/inventory/sku-1": 2}, "the dry-run reached the service"
    replayed = [e for e in derived_events(app, report.trace_id) if e.name == "call"]
    assert [e.data.get("replayed") for e in replayed] == [True]
    port = service.base_url.rsplit(":", 1)[1]
    assert report.unrecorded_io == [
        f"unrecorded I/O at step 'charge': socket.connect 127.0.0.1:{port}"
    ]


def test_a_sealed_live_run_lets_the_awaited_call_through_and_refuses_the_direct_one(
    app: replayq.App, service: Service
) -> None:
    job = run_inline(app, "peek", {"sku": "sku-1"}, seal=True)

    port = service.base_url.rsplit(":", 1)[1]
    assert job.state == JobState.DEAD
    assert (
        f"UnrecordedIOError: unrecorded I/O outside any step: socket.connect 127.0.0.1:{port}"
        in (job.last_error or "")
    )
    assert service.counts() == {"/inventory/sku-1": 1}, "only the call through ctx went out"
