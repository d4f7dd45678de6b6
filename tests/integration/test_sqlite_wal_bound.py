"""The SQLite WAL stays bounded under readers that never pause, and a reader that
outlasts ``busy_timeout`` does not make every commit wait for it.

SQLite's automatic checkpoint is passive: it restarts the WAL only when no reader is
using it, so overlapping readers let the WAL grow past every checkpoint (on a small disk,
until nothing can commit; ``test_sqlite_faults.py`` causes that on a full tmpfs). replayq
restarts a WAL that has grown past twice its checkpoint size from the commit that finds
it so (docs/reliability.md, "How SQLite gets through a full disk"). Real files, real
reader connections in threads.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import replayq
from tests.sqlite_readers import readers_that_never_pause

# The automatic checkpoint's size on a disk with room (``_WAL_AUTOCHECKPOINT_BYTES``).
CHECKPOINT_BYTES = 4000 * 4096
# What the WAL stays under here: restarted past twice the checkpoint's size; a restart
# that cannot finish within its 0.2 s (a machine loaded past what these runs saw) or
# meets another process's checkpoint costs up to one checkpoint's growth more. Without
# the bound these runs end at 170-250 MB.
BOUND = 3 * CHECKPOINT_BYTES + 2 * 1024 * 1024


def _app(db: Path, query: str = "") -> replayq.App:
    app = replayq.App(f"sqlite:///{db}{query}")

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def _wal_bytes(db: Path) -> int:
    return Path(f"{db}-wal").stat().st_size


def test_readers_that_never_pause_do_not_let_the_wal_outgrow_twice_its_checkpoint(
    tmp_path: Path,
) -> None:
    db = tmp_path / "q.db"
    app = _app(db)
    app.enqueue("noop", {"n": -1})  # the schema exists for the readers
    largest = 0
    with readers_that_never_pause(db, count=2, hold=0.02):
        # ~28 KB of WAL an enqueue: 6,000 are ~10 checkpoints' worth, all under readers
        # (without the bound the WAL ends at ~170 MB).
        for n in range(6000):
            app.enqueue("noop", {"n": n})
            if n % 100 == 0:
                largest = max(largest, _wal_bytes(db))
    largest = max(largest, _wal_bytes(db))
    app.close()
    # Restarted once past twice the checkpoint's size, readers or not: before the restart
    # was retried within its wait, one try in three lost its 0.2 s to the readers passing
    # a read mark's slot between them, and the WAL passed 4 and once 5 checkpoints' size.
    assert largest <= BOUND, largest


def test_a_reader_that_outlasts_busy_timeout_is_logged_and_not_waited_for_at_every_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "q.db"
    app = _app(db)
    app.enqueue("noop", {"n": -1})
    caplog.set_level(logging.WARNING, logger="replayq.storage.sqlite")
    with readers_that_never_pause(db, count=1, hold=0):  # one read transaction, open throughout
        started = time.monotonic()
        for n in range(4000):
            app.enqueue("noop", {"n": n})
        spent = time.monotonic() - started
    wal = _wal_bytes(db)
    app.close()
    starved = [r for r in caplog.records if "checkpoint starvation" in r.getMessage()]
    # The WAL grew to several checkpoints' size (nothing could restart it); each try
    # past twice its size waited 0.2 s for the reader once, then waited for more growth
    # (the wait is replayq's own, not the connection's busy_timeout of 5 s).
    assert wal > 3 * CHECKPOINT_BYTES, wal
    assert 1 <= len(starved) <= wal // CHECKPOINT_BYTES, [r.getMessage() for r in starved]
    # Had every commit past the bound waited its 0.2 s, this would take minutes.
    assert spent < 4000 * 0.2 / 20, spent


ENQUEUER = """
import sys
import replayq
app = replayq.App(f"sqlite:///{sys.argv[1]}")
app.job("noop")(lambda ctx, n: None)
for n in range(int(sys.argv[2])):
    app.enqueue("noop", {"n": n})
app.close()
"""


def test_the_bound_holds_with_several_writing_processes(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    app = _app(db)
    app.enqueue("noop", {"n": -1})
    logs = [tmp_path / f"writer-{n}.log" for n in range(2)]
    largest = 0
    with readers_that_never_pause(db, count=2, hold=0.02):
        writers = []
        for log in logs:
            with log.open("w") as out:
                command = [sys.executable, "-c", ENQUEUER, str(db), "4000"]
                writers.append(subprocess.Popen(command, stderr=out))
        while any(w.poll() is None for w in writers):
            largest = max(largest, _wal_bytes(db))
            time.sleep(0.01)
    errors = [log.read_text()[-2000:] for log in logs]
    assert [w.returncode for w in writers] == [0, 0], errors
    largest = max(largest, _wal_bytes(db))
    app.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM rq_jobs").fetchone()[0] == 8001
    # A process whose try meets the other's checkpoint (SQLite's checkpoint lock) tries
    # again at its next commit; no writer waited past its busy_timeout (return codes).
    assert largest <= BOUND, largest


NOOP_MODULE = """
import replayq
app = replayq.App("sqlite:///unused.db")
app.job("noop")(lambda ctx, n: None)
"""


@pytest.mark.parametrize("command", ["worker", "enqueue"])
def test_a_command_leaves_no_wal_behind(tmp_path: Path, command: str) -> None:
    """A ``replayq`` process closes its connections as the command ends: the last one
    checkpoints the WAL and removes it. Left behind (a worker's ~16 MB at most), the next
    process to open the file read all of it back and copied it at its first checkpoint:
    a 2,000-job enqueue after a 4,000-job drain took ~20 % longer (docs/operations.md)."""
    db = tmp_path / "q.db"
    (tmp_path / "noop_module.py").write_text(NOOP_MODULE)
    app = _app(db)
    app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(300)])
    app.close()
    assert not Path(f"{db}-wal").exists()
    replayq_cli = str(Path(sys.executable).with_name("replayq"))
    args = {
        "worker": ["worker", "--app", "noop_module:app", "--burst"],
        "enqueue": ["enqueue", "noop", "--app", "noop_module:app", "--payload", '{"n": 1}'],
    }[command]
    done = subprocess.run(
        [replayq_cli, "--db", f"sqlite:///{db}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not Path(f"{db}-wal").exists(), "the WAL was left for the next process"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM rq_jobs GROUP BY state"))
    assert states == ({"succeeded": 300} if command == "worker" else {"queued": 301})
