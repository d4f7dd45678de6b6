"""The exit-code table's promise for code 3 (docs/reliability.md): a command that meets a
storage fault — SQLite locked past ``busy_timeout``, a full disk, a read-only file system,
a disk failing ``EIO`` — exits 3 ("storage unavailable; trying again later may work"),
says so in one ``error: …`` line, writes nothing, and the same command works once the
fault has cleared.

Each fault is caused for real under a real ``replayq`` process: another process holding
``BEGIN IMMEDIATE``, an 8 MB tmpfs filled with ballast (root), a FUSE mount switched to
``EROFS`` or ``EIO`` (``tests/faultfs.py``; the fixtures of ``test_sqlite_faults.py``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_sqlite_enqueue_faults import write_lock_held
from tests.acceptance.test_sqlite_faults import (  # noqa: F401 - fixtures
    FaultyDisk,
    faulty_disk,
    small_disk,
)
from tests.acceptance.workers import run_cli
from tests.apps import sleepy


def _jobs(database: Path) -> list[tuple[int, str]]:
    """Every job's id and state, read by a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        return [(int(i), str(s)) for i, s in conn.execute("SELECT id, state FROM rq_jobs")]


@contextlib.contextmanager
def _disk_filled(directory: Path) -> Iterator[None]:
    """The file system of ``directory`` full until the block ends (the ballast deleted)."""
    ballast = directory / "ballast"
    with ballast.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
    try:
        yield
    finally:
        ballast.unlink()


@contextlib.contextmanager
def _switched(disk: FaultyDisk, fault: str) -> Iterator[None]:
    disk.set(fault)
    try:
        yield
    finally:
        disk.set("ok")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["locked", "full", "readonly", "eio"])
def test_a_command_that_meets_a_storage_fault_exits_3_in_one_line_and_writes_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, fault: str
) -> None:
    if fault == "full":
        directory: Path = request.getfixturevalue("small_disk")
    elif fault in ("readonly", "eio"):
        disk: FaultyDisk = request.getfixturevalue("faulty_disk")
        directory = disk.mount
    else:
        directory = tmp_path
    database = directory / "q.db"
    url = f"sqlite:///{database}?busy_timeout=300"
    app = sleepy.build(url)
    queued = app.enqueue("sleep", {"log": str(tmp_path / "runs.jsonl"), "n": 0, "seconds": 0})
    app.close()  # the last connection: the WAL is checkpointed into the file and removed
    payload = json.dumps({"log": str(tmp_path / "runs.jsonl"), "n": 1, "seconds": 0})
    commands = {
        "enqueue": ("enqueue", "sleep", "--app", "tests.apps.sleepy:app", "--payload", payload),
        "cancel": ("jobs", "cancel", str(queued)),
    }
    if fault == "locked":
        during = write_lock_held(database)
    elif fault == "full":
        during = _disk_filled(directory)
    else:
        during = _switched(disk, fault)
    with during:
        for name, argv in commands.items():
            done = run_cli(url, *argv)
            # 3: storage unavailable, try again later; not 4 (a bug), not a crash.
            assert done.returncode == 3, (name, done.returncode, done.stdout, done.stderr)
            lines = done.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (name, done.stderr)
            assert "Traceback" not in done.stderr
            assert done.stdout == "", (name, done.stdout)
    assert _jobs(database) == [(queued, "queued")], "the refused commands wrote nothing"
    # The fault cleared: the same commands go through, with no restart of anything.
    enqueued = run_cli(url, *commands["enqueue"])
    assert enqueued.returncode == 0, enqueued.stderr
    cancelled = run_cli(url, *commands["cancel"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert _jobs(database) == [(queued, "cancelled"), (int(enqueued.stdout), "queued")]
