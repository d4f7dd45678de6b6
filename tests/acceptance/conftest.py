"""Fixtures for acceptance tests: a real SQLite file shared by real worker subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher
from tests.apps import sleepy


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[WorkerLauncher]:
    """Start ``replayq worker`` subprocesses on this test's database; all killed afterwards."""
    workers = WorkerLauncher(tmp_path / "queue.db", tmp_path)
    yield workers
    workers.kill_all()
    for worker in workers.started:  # shown by pytest only when the test failed
        print(f"--- worker {worker.worker_id} (pid {worker.pid}) ---\n{worker.log()}")


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
