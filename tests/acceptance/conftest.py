"""Fixtures for acceptance tests: one database shared by real worker subprocesses.

``launcher`` is parametrized over every backend, as ``app_factory`` is for the
conformance suite: each kill, stall, heartbeat, shutdown and ordering test runs once
on a real SQLite file and once on a fresh PostgreSQL schema (migrated before the
first worker starts, so that two workers never race to create it).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import CALL_PASSED, WorkerLauncher, show_worker_logs
from tests.apps import sleepy
from tests.conftest import BACKENDS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test's call passed, for fixtures that show logs on failure."""
    report = yield
    if report.when == "call":
        item.stash[CALL_PASSED] = report.passed
    return report


@pytest.fixture(params=BACKENDS)
def launcher(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkerLauncher]:
    """Start ``replayq worker`` subprocesses on this test's database; all killed afterwards."""
    if request.param == "sqlite":
        workers = WorkerLauncher(tmp_path / "queue.db", tmp_path)
    else:
        url = str(request.getfixturevalue("pg_schema_url"))
        migrator = replayq.App(url, auto_migrate=True)
        migrator.storage  # noqa: B018 - opening it migrates the test's schema
        migrator.close()
        workers = WorkerLauncher(url, tmp_path)
    yield workers
    workers.kill_all()
    show_worker_logs(request, workers.started)


@pytest.fixture
def sleepy_app(launcher: WorkerLauncher) -> Iterator[replayq.App]:
    """The ``tests.apps.sleepy`` job types on the launcher's database, to enqueue and read."""
    app = sleepy.build(launcher.url)
    yield app
    app.close()


@pytest.fixture
def side_file(tmp_path: Path) -> Path:
    """Where handlers append one JSON line per start and end (the ground truth of execution)."""
    return tmp_path / "runs.jsonl"
