"""A replay is sealed: handler I/O that bypasses ``ctx`` never reaches the world.

The handlers of ``tests.apps.leaky`` call a real counting HTTP service with
``urllib``, run a subprocess, and write a file, all without ``ctx``. Live they
do it for real; a dry-run, a fork and ``assert_replays`` refuse it, name the
call, its target and the step, and leave the service's count, the marker file
and the written file as they were. ``allow_io`` lets it through and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import replayq
from replayq.storage.protocol import TraceQuery
from replayq.testing import assert_replays, run_inline
from tests.apps import leaky
from tests.replay_support import cli, cli_ok
from tests.services import Service

LEAKY_SPEC = "tests.apps.leaky:app"


@pytest.fixture
def app(app_factory: object, service: Service) -> replayq.App:
    made = app_factory()  # type: ignore[operator]
    return leaky.declare(made)


def recorded(app: replayq.App, job_type: str, payload: dict[str, object]) -> replayq.Job:
    job = run_inline(app, job_type, payload)
    assert job.state == replayq.JobState.SUCCEEDED, job.last_error
    return job


def test_a_live_worker_makes_the_direct_call(app: replayq.App, service: Service) -> None:
    recorded(app, "leaky_http", {"sku": "sku-1"})
    assert service.counts().get("/inventory/sku-1") == 1


def test_dry_run_refuses_a_direct_http_call_and_reports_it_with_its_step(
    app: replayq.App, service: Service
) -> None:
    job = recorded(app, "leaky_http", {"sku": "sku-1"})
    port = service.base_url.rsplit(":", 1)[1]

    report = replayq.dry_run(app, job.id)

    assert service.counts().get("/inventory/sku-1") == 1  # the recording's call only
    assert report.diverged
    assert report.unrecorded_io == [
        f"unrecorded I/O at step 'charge': socket.connect 127.0.0.1:{port}"
    ]
    assert report.first_divergence is not None
    assert report.first_divergence.step == "charge"
    kinds = [
        e.name
        for e in app.storage.transaction(readonly=True)
        .__enter__()
        .trace_query(TraceQuery(trace_id=report.trace_id))
    ]
    assert "io.unrecorded" in kinds


def test_fork_refuses_a_direct_http_call(app: replayq.App, service: Service) -> None:
    job = recorded(app, "leaky_http", {"sku": "sku-1"})

    report = replayq.fork(app, job.id, from_step="charge")

    assert service.counts().get("/inventory/sku-1") == 1
    assert report.unrecorded_io and "step 'charge'" in report.unrecorded_io[0]


def test_allow_io_lets_the_call_happen_and_says_so(app: replayq.App, service: Service) -> None:
    job = recorded(app, "leaky_http", {"sku": "sku-1"})

    report = replayq.dry_run(app, job.id, allow_io=True)

    assert service.counts().get("/inventory/sku-1") == 2
    assert report.unrecorded_io == []
    assert report.allowed_io and "socket.connect" in report.allowed_io[0]


def test_dry_run_refuses_a_subprocess(app: replayq.App, tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    job = recorded(app, "leaky_subprocess", {"marker": str(marker)})
    marker.unlink()

    report = replayq.dry_run(app, job.id)

    assert not marker.exists()
    assert report.unrecorded_io and "at step 'notify': subprocess.Popen" in report.unrecorded_io[0]


def test_dry_run_refuses_a_file_write_outside_its_temp_dir(
    app: replayq.App, tmp_path: Path
) -> None:
    written = tmp_path / "out.txt"
    job = recorded(app, "leaky_file", {"path": str(written)})

    report = replayq.dry_run(app, job.id)

    assert written.read_text() == "written\n"  # the live run's line, and no second one
    assert report.unrecorded_io and "at step 'write': open" in report.unrecorded_io[0]


def test_assert_replays_fails_on_unrecorded_io(app: replayq.App, service: Service) -> None:
    job = recorded(app, "leaky_http", {"sku": "sku-1"})
    case = replayq.export_case(app, job.id)

    with pytest.raises(AssertionError, match=r"bypasses ctx.*step 'charge'.*socket\.connect"):
        assert_replays(case, app)
    assert service.counts().get("/inventory/sku-1") == 1


def test_run_inline_with_seal_gives_users_the_same_guard(
    app: replayq.App, service: Service
) -> None:
    job = run_inline(app, "leaky_http", {"sku": "sku-1"}, seal=True)

    assert job.state == replayq.JobState.DEAD
    assert "UnrecordedIOError" in (job.last_error or "") or "unrecorded I/O" in (
        job.last_error or ""
    )
    assert service.counts().get("/inventory/sku-1") is None


def test_cli_dry_run_and_fork_exit_1_on_unrecorded_io_and_allow_io_says_so(
    sqlite_url: str, service: Service
) -> None:
    app = leaky.declare(replayq.App(sqlite_url, auto_migrate=True))
    try:
        job = recorded(app, "leaky_http", {"sku": "sku-1"})
    finally:
        app.close()

    dry = cli(sqlite_url, "replay", str(job.id), "--mode", "dry-run", "--app", LEAKY_SPEC)
    assert dry.returncode == 1, dry.stderr
    assert "UNRECORDED I/O, refused: unrecorded I/O at step 'charge': socket.connect" in dry.stdout
    forked = cli(sqlite_url, "fork", str(job.id), "--from-step", "charge", "--app", LEAKY_SPEC)
    assert forked.returncode == 1, forked.stderr
    assert "UNRECORDED I/O" in forked.stdout
    assert service.counts().get("/inventory/sku-1") == 1

    allowed = cli_ok(
        sqlite_url, "replay", str(job.id), "--mode", "dry-run", "--app", LEAKY_SPEC, "--allow-io"
    )
    assert "WARNING --allow-io: real I/O that bypassed ctx happened" in allowed.stdout
    assert service.counts().get("/inventory/sku-1") == 2
