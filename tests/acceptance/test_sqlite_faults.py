"""SQLite faults are waited out: a write lock held past ``busy_timeout``, a full disk,
a read-only file system, a disk that fails with ``EIO``.

Real worker processes on a real file. The fault lands while they drain jobs whose
handler runs an effect; afterwards every job has succeeded, none is dead, no effect
is in doubt, each effect ran once, and the workers are the same processes (no
restart). The disk-full test needs root (it mounts a small tmpfs). The read-only and
``EIO`` tests put the file on a FUSE mount whose faults are switched at run time
(``tests/faultfs.py``; Debian's ``fuse3``, ``mfusepy``). Each skips on a developer's
machine that cannot cause its fault, and fails in CI.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from replayq.storage.protocol import idem_get
from tests import chaos_check
from tests.acceptance.workers import (
    WorkerLauncher,
    WorkerProcess,
    read_lines,
    wait_for,
    wait_for_progress,
)
from tests.apps import storage_faults
from tests.conftest import missing
from tests.services import Service
from tests.sqlite_readers import readers_that_never_pause

APP = "tests.apps.storage_faults:app"
HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def _counts(app: replayq.App) -> Counter[str]:
    return Counter(job.state.value for job in app.list_jobs(limit=10_000))


def _succeeded(database: Path) -> int:
    """How many jobs succeeded: one COUNT, light enough to poll beside thousands of jobs."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        return int(
            conn.execute("SELECT COUNT(*) FROM rq_jobs WHERE state = 'succeeded'").fetchone()[0]
        )


def _assert_all_delivered_once(
    title: str,
    app: replayq.App,
    effects_service: Service,
    sink: Path,
    total: int,
    recovery_seconds: float,
) -> None:
    # The chaos checker over the database and the counting server: its table printed for
    # the record (make chaos runs with -s), every bad count zero.
    chaos_check.assert_clean(
        title,
        app.url,
        effects_service.base_url,
        expected=total,
        recovery_seconds=recovery_seconds,
        sink=sink,
    )
    jobs = app.list_jobs(limit=10_000)
    assert Counter(j.state for j in jobs) == {replayq.JobState.SUCCEEDED: total}
    effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
    assert sorted(effects) == list(range(total)), "every effect ran"
    assert max(effects.values()) == 1, f"an effect ran twice: {effects.most_common(3)}"
    with app.storage.transaction(readonly=True) as tx:
        in_doubt = [
            n
            for n in range(total)
            if getattr(idem_get(tx, f"deliver:{n}:parcel.deliver"), "status", None) != "succeeded"
        ]
    assert in_doubt == [], "no effect record left started (in doubt)"
    with app.storage.transaction(readonly=True) as tx:
        failed = tx.connection.execute(
            "SELECT job_id, data FROM rq_events WHERE name = 'job.failed' LIMIT 5"
        ).fetchall()
        parcels = tx.connection.execute(
            "SELECT COUNT(*) FROM rq_entities WHERE namespace = 'parcel' AND branch = 'main'"
        ).fetchone()[0]
    # A step commit that met the fault is not the job's failure: no attempt failed for it.
    assert failed == [], f"attempts failed because of the storage fault: {failed}"
    assert parcels == total, "every step's state write committed"


def test_a_write_lock_held_past_the_busy_timeout_is_waited_out(
    tmp_path: Path, effects_service: Service
) -> None:
    database = tmp_path / "queue.db"
    launcher = WorkerLauncher(database, tmp_path)
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(launcher.url)
    total = 500
    try:
        for n in range(total):
            app.enqueue("deliver", {"n": n, "sink": str(sink)})
        # Job 10 waits inside its step until the lock is taken: its step's commit meets it.
        hold, env = storage_faults.hold_inside_step(tmp_path)
        workers = [launcher.start(f"w{i}", app=APP, concurrency=2, env=env) for i in range(4)]
        wait_for(lambda: _counts(app)["succeeded"] >= 20, timeout=30, what="work under way")
        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="job 10 inside its step")
        held = next(j for j in app.list_jobs(limit=10_000) if j.payload["n"] == 10)
        assert held.state.value == "running", "job 10 is held inside its step"

        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(database), "12"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        hold.unlink()  # job 10's step now commits into the locked database
        started = time.monotonic()
        # An enqueue meets the lock too: it waits busy_timeout, then says why, with the cause.
        with pytest.raises(replayq.DatabaseUnavailableError, match="database is locked") as info:
            app.enqueue("deliver", {"n": total, "sink": str(sink)})
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert holder.wait(30) == 0
        released = time.monotonic()
        holder.stdout.close()
        assert released - started >= 10, "the lock really outlasted the busy timeout"

        wait_for(
            lambda: _counts(app)["succeeded"] == total,
            timeout=120,
            what=f"all {total} jobs to succeed after the lock",
        )
        _assert_all_delivered_once(
            "SQLite, BEGIN EXCLUSIVE held 12 s under four workers",
            app,
            effects_service,
            sink,
            total,
            time.monotonic() - released,
        )
        put_back = [e for e in app.trace(held.id) if e.name == "lease.released"]
        assert put_back and "database is locked" in put_back[0].data["storage_fault"], (
            "the held job was put back, not failed"
        )
        for worker in workers:
            assert worker.proc.poll() is None, f"worker {worker.worker_id} died\n{worker.log()}"
        logs = "\n".join(w.log() for w in workers)
        assert "Traceback" not in logs
        assert "database unavailable" in logs and "database is locked" in logs
    finally:
        launcher.kill_all()
        app.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("offset", [30.0, -30.0])
def test_one_worker_with_its_clock_off_by_30_s_loses_duplicates_and_accepts_nothing_stale(
    tmp_path: Path, effects_service: Service, offset: float
) -> None:
    """Leases are judged by the database's clock, not by the workers' own: a worker 30 s
    fast reaps no live lease of the others (before, judged by its own clock, it reaped
    them: 9 wrongly in a run of 300, one job buried ``effect_in_doubt``), and its own
    leases are granted and extended in the database's time. A worker 30 s slow leases
    nothing due before its own now (every job here is due at its enqueue): it sits idle
    while the others drain. Either way the checker's table must stay clean."""
    database = tmp_path / "queue.db"
    launcher = WorkerLauncher(database, tmp_path)
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(launcher.url)
    total = 300
    try:
        for n in range(total):
            app.enqueue("deliver", {"n": n, "sink": str(sink)})
        started = time.monotonic()
        workers = [launcher.start(f"w{i}", app=APP, concurrency=2) for i in range(2)]
        skewed = launcher.start(
            "skewed", app=APP, concurrency=2, env={"CHAOS_CLOCK_OFFSET": str(offset)}
        )
        wait_for(
            lambda: sum(_counts(app)[s] for s in ("succeeded", "dead")) == total,
            timeout=180,
            what=f"all {total} jobs to settle with one worker's clock off by {offset:+.0f} s",
        )
        # Every worker stayed alive and heartbeating: any lease judged expired was misjudged.
        expired = [
            e
            for job in app.list_jobs(limit=total)
            for e in app.trace(job.id)
            if e.name == "lease.expired"
        ]
        assert expired == [], f"{len(expired)} live lease(s) reaped, by {expired[0].worker_id}"
        _assert_all_delivered_once(
            f"SQLite, one worker of three with its clock off by {offset:+.0f} s",
            app,
            effects_service,
            sink,
            total,
            time.monotonic() - started,
        )
        for worker in [*workers, skewed]:
            assert worker.proc.poll() is None, f"worker {worker.worker_id} died\n{worker.log()}"
    finally:
        launcher.kill_all()
        app.close()


TMPFS_SIZE = "8m"


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An 8 MB tmpfs mounted for this test (needs root); unmounted afterwards."""
    if os.geteuid() != 0:
        missing("mounting a tmpfs needs root", install="run the tests as root (CI does)")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        missing(
            f"cannot mount a tmpfs here: {done.stderr.strip()}",
            install="a machine where root may mount a tmpfs",
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("readers", [0, 2], ids=["quiet", "readers-never-pause"])
def test_a_full_disk_is_waited_out_and_the_worker_resumes_when_space_is_freed(
    small_disk: Path, tmp_path: Path, effects_service: Service, readers: int
) -> None:
    database = small_disk / "queue.db"
    launcher = WorkerLauncher(database, tmp_path)
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(launcher.url)
    total = 128
    reading = contextlib.ExitStack()
    try:
        ids = [app.enqueue("deliver", {"n": n, "sink": str(sink)}) for n in range(total)]
        # As in a queue that has run a while, the data is in the file, not only in the WAL
        # (with all of it in the WAL, a checkpoint could never find room on 8 MB).
        with sqlite3.connect(database) as checkpoint:
            checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # The disk fills under a working worker, while job 10 waits inside its step (its
        # commit may still fit in the WAL's free pages; whatever of it meets the full disk
        # — the step, an effect's record, the ack — is waited out, never a failure).
        # With readers that never pause, only a checkpoint that waits for them (replayq's,
        # once the WAL has outgrown its automatic checkpoints) keeps the WAL from taking
        # the whole disk, the room the checkpoint itself needs included.
        reading.enter_context(readers_that_never_pause(database, count=readers, hold=0.1))
        hold, env = storage_faults.hold_inside_step(tmp_path)
        worker = launcher.start("w0", app=APP, concurrency=2, env=env)
        held = next(j for j in app.list_jobs(limit=1000) if j.payload["n"] == 10)
        wait_for(
            lambda: (
                app.get_job(held.id).state.value == "running" and _counts(app)["succeeded"] >= 10
            ),
            timeout=60,
            what="work under way, job 10 held inside its step",
        )
        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="job 10 inside its step")
        ballast = small_disk / "ballast"
        # Unbuffered: a buffered file keeps the chunk that did not fit and raises ENOSPC
        # again when it is closed.
        with ballast.open("wb", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
            except OSError:
                pass
        hold.unlink()
        # Enqueue on a full disk: the cause is named, never masked by a failed ROLLBACK.
        with pytest.raises(replayq.StorageUnavailableError, match="full") as info:
            for n in range(total, total + 100_000):
                ids.append(app.enqueue("deliver", {"n": n, "sink": str(sink)}))
        assert "cannot rollback" not in str(info.value)
        # Every enqueue that returned an id is a job; the one that raised left nothing.
        total = len(ids)
        assert sorted(j.id for j in app.list_jobs(limit=100_000)) == sorted(ids)

        wait_for(
            lambda: "database or disk is full" in worker.log(),
            timeout=60,
            what="the worker to say the disk is full",
        )
        time.sleep(2)
        assert worker.proc.poll() is None, f"the worker died on a full disk\n{worker.log()}"

        ballast.unlink()
        freed = time.monotonic()
        # How many jobs the full disk still took depends on the WAL's free pages (128 to some
        # thousands): the worker must keep going until every one has run, however long that is.
        wait_for_progress(
            lambda: _succeeded(database),
            total,
            stall=60,
            what=f"all {total} jobs to succeed once space is freed",
        )
        _assert_all_delivered_once(
            "SQLite on an 8 MB tmpfs that fills up",
            app,
            effects_service,
            sink,
            total,
            time.monotonic() - freed,
        )
        assert worker.proc.poll() is None
        assert "Traceback" not in worker.log()
    finally:
        reading.close()
        launcher.kill_all()
        app.close()


class FaultyDisk:
    """A directory on a FUSE mount (``tests/faultfs.py``) whose faults the test switches."""

    def __init__(self, mount: Path, server: subprocess.Popen[str]) -> None:
        self.mount = mount
        self.server = server

    def set(self, mode: str) -> None:
        """``ok``, ``readonly`` or ``eio``; in force for every process when this returns."""
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.write(f"{mode}\n")
        self.server.stdin.flush()
        assert self.server.stdout.readline().strip() == mode


@pytest.fixture
def faulty_disk(tmp_path: Path) -> Iterator[FaultyDisk]:
    """A FUSE passthrough of a plain directory, mounted for this test (needs root and
    ``/dev/fuse``); unmounted afterwards."""
    install = "apt-get install fuse3 (libfuse3) and pip install -r requirements.lock (mfusepy)"
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        missing("a FUSE mount needs root and /dev/fuse", install=install)
    if (
        importlib.util.find_spec("mfusepy") is None
        or ctypes.util.find_library("fuse3") is None
        or shutil.which("fusermount3") is None
    ):
        missing("FUSE is not installed (mfusepy, libfuse3, fusermount3)", install=install)
    backing, mount = tmp_path / "backing", tmp_path / "faulty"
    backing.mkdir()
    mount.mkdir()
    errors = tmp_path / "faultfs.log"
    with errors.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.faultfs", str(backing), str(mount)],
            cwd=Path(__file__).resolve().parents[2],
            # mfusepy takes libfuse 2 when both are installed; the server is written for 3.
            env={**os.environ, "FUSE_LIBRARY_NAME": "fuse3"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if server.poll() is not None or time.monotonic() > deadline:
                missing(f"cannot mount FUSE here: {errors.read_text().strip()}", install=install)
            time.sleep(0.05)
        yield FaultyDisk(mount, server)
    finally:
        if server.stdin is not None:
            server.stdin.close()  # the server unmounts and exits once the files are closed
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True, check=False)


# What SQLite reports for each fault (it keeps the errno to itself): a write refused
# ``EROFS`` is ``disk I/O error`` (SQLITE_IOERR_WRITE), and a connection opened meanwhile
# is read-only (SQLITE_READONLY); a read that fails ``EIO`` is ``database disk image is
# malformed`` (SQLITE_IOERR_CORRUPTFS), a write ``disk I/O error``.
FAULT_CAUSES = {
    "readonly": r"the file cannot be written|file system is read-only",
    "eio": r"disk I/O error|an I/O error \(EIO\)",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["readonly", "eio"])
def test_a_read_only_or_failing_disk_is_waited_out_and_the_worker_resumes_when_it_clears(
    faulty_disk: FaultyDisk, tmp_path: Path, effects_service: Service, fault: str
) -> None:
    """The database file and its WAL on a FUSE mount that, while the fault lasts, answers

    * ``readonly``: every write, ``fsync``, truncate, open for writing, create, rename and
      unlink with ``EROFS`` (reads work), as a file system remounted read-only after errors;
    * ``eio``: every read, write and ``fsync`` with ``EIO``, as a failing disk.

    Reads and writes of the ``-shm`` file (SQLite's WAL index, mapped into memory) do
    not fail: a fault there only shows when the kernel writes the mapping back; opening
    it for writing is refused while read-only, as on a real read-only file system.
    The fault starts while a worker drains jobs with effects and lasts until the worker
    has said why and backed off; an enqueue meanwhile fails, naming the cause, and
    leaves nothing; a second worker started during the fault runs jobs after it.
    """
    database = faulty_disk.mount / "queue.db"
    launcher = WorkerLauncher(database, tmp_path)
    sink = tmp_path / "effects.jsonl"  # the effects' ground truth, off the faulty disk
    app = storage_faults.build(launcher.url)
    # Enough that the fault lands mid-drain (~200 jobs/s on a quiet machine): an idle
    # worker on a read-only file system writes nothing, so it has nothing to notice.
    total = 400
    cause = FAULT_CAUSES[fault]
    try:
        for n in range(total):
            app.enqueue("deliver", {"n": n, "sink": str(sink)})
        # Job 10 waits inside its step until the fault is on: its step's commit meets it.
        hold, env = storage_faults.hold_inside_step(tmp_path)
        worker = launcher.start("w0", app=APP, concurrency=2, env=env)
        held = wait_for(
            lambda: next(
                (
                    j
                    for j in app.list_jobs(limit=10_000)
                    if j.payload["n"] == 10 and j.state.value == "running"
                ),
                None,
            ),
            timeout=60,
            what="job 10 held inside its step",
        )
        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="job 10 inside its step")
        wait_for(lambda: _counts(app)["succeeded"] >= 10, timeout=60, what="work under way")
        assert _counts(app)["succeeded"] < total - 100, "the fault must land mid-drain"
        faulty_disk.set(fault)
        hold.unlink()  # job 10's step now commits onto the faulty disk
        wait_for(
            lambda: "database unavailable" in worker.log(),
            timeout=60,
            what=f"the worker to say the database is unavailable ({fault})",
        )
        with pytest.raises(replayq.DatabaseUnavailableError, match=cause) as info:
            app.enqueue("deliver", {"n": total, "sink": str(sink)}, message_id="during-fault")
        assert "cannot rollback" not in str(info.value)
        assert isinstance(info.value.__cause__, sqlite3.Error)
        # A worker started during the fault opens its connections then (read-only ones,
        # on a read-only file system): it must write once the fault clears, unrestarted.
        late = launcher.start("late", app=APP, concurrency=2)
        time.sleep(3)  # the fault lasts: the workers back off, and stay alive
        for each in (worker, late):
            assert each.proc.poll() is None, f"{each.worker_id} died ({fault})\n{each.log()}"
        during = worker.log()

        faulty_disk.set("ok")
        cleared = time.monotonic()
        wait_for(
            lambda: _counts(app)["succeeded"] == total,
            timeout=120,
            what=f"all {total} jobs to succeed once the fault ({fault}) clears",
        )
        for each in (worker, late):
            assert each.proc.poll() is None, f"{each.worker_id} died\n{each.log()}"
        # The enqueue that failed left nothing: no job, and its message id is free.
        assert [j for j in app.list_jobs(limit=10_000) if j.payload["n"] == total] == []
        # The late worker alone is left to run it: its connections, opened during the
        # fault, write again.
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        again = app.enqueue("deliver", {"n": total, "sink": str(sink)}, message_id="during-fault")
        total += 1
        wait_for(
            lambda: _counts(app)["succeeded"] == total,
            timeout=60,
            what=f"the worker started during the fault to run a job\n{late.log()}",
        )
        assert {e.worker_id for e in app.trace(again) if e.name == "job.leased"} == {"late"}
        _assert_all_delivered_once(
            f"SQLite on a FUSE mount that turns {fault} and back",
            app,
            effects_service,
            sink,
            total,
            time.monotonic() - cleared,
        )
        put_back = [e for e in app.trace(held.id) if e.name == "lease.released"]
        assert put_back and re.search(cause, put_back[0].data["storage_fault"]), (
            f"the held job was put back for the fault, not failed: {put_back}"
        )
        assert late.proc.poll() is None
        for each in (worker, late):
            assert "Traceback" not in each.log()
        # The worker said why, once per loop that met the fault (the cause may change
        # once, as SQLite meets a read before a write), not once per job or retry.
        said = re.findall(r"replayq.reconnect: (.+?): database unavailable \((.*)", during)
        assert said and all(re.search(cause, why) for _, why in said), said
        per_loop = Counter(what for what, _ in said)
        assert max(per_loop.values()) <= 2, per_loop
    finally:
        launcher.kill_all()
        app.close()


# Pages a write of another process leaves in the WAL, new to the database file: its
# checkpoint must grow the file by this much.
GROWTH = 3 * 1024 * 1024


def _write_pages_the_file_lacks(database: Path, worker: WorkerProcess) -> None:
    """Commit ``GROWTH`` bytes of new pages to the WAL without checkpointing them, while
    ``worker`` is stopped (so none of its commits checkpoints them first); a worker stopped
    holding the write lock is let go on for a moment and stopped again."""
    while True:
        conn = sqlite3.connect(database, timeout=0.5, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS growth (b BLOB)")
            for _ in range(GROWTH // 65536):
                conn.execute("INSERT INTO growth VALUES (zeroblob(65536))")
            conn.execute("COMMIT")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error):
                raise
            worker.signal(signal.SIGCONT)
            time.sleep(0.1)
            worker.signal(signal.SIGSTOP)
        finally:
            conn.close()


@pytest.mark.timeout(120)
def test_a_disk_too_full_for_the_database_file_to_grow_refuses_writes_until_space_is_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    """docs/reliability.md, "What cannot be waited out": the WAL holds pages the database
    file lacks and the disk has no room for them, so no checkpoint can run (unlike the
    full WAL above, where a checkpoint makes room). Writes stay refused, saying the disk is
    full; the worker stays alive and says why; once space is freed it resumes by itself."""
    database = small_disk / "queue.db"
    launcher = WorkerLauncher(database, tmp_path)
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(launcher.url)
    total = 20
    try:
        ids = [app.enqueue("deliver", {"n": n, "sink": str(sink)}) for n in range(total)]
        hold, env = storage_faults.hold_inside_step(tmp_path)
        env["STORAGE_FAULTS_HOLD_JOB"] = "0"
        worker = launcher.start("w0", app=APP, concurrency=1, env=env)
        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="job 0 inside its step")
        worker.signal(signal.SIGSTOP)
        _write_pages_the_file_lacks(database, worker)
        wal = database.with_name(database.name + "-wal")
        assert wal.stat().st_size >= GROWTH
        file_size = database.stat().st_size
        ballast = small_disk / "ballast"
        with ballast.open("wb", buffering=0) as out:  # unbuffered, as above
            try:
                while True:
                    out.write(b"\0" * 65536)
            except OSError:
                pass
        worker.signal(signal.SIGCONT)
        hold.unlink()

        with pytest.raises(replayq.StorageUnavailableError, match="full") as info:
            app.enqueue("deliver", {"n": total, "sink": str(sink)})
        assert "cannot rollback" not in str(info.value)
        wait_for(
            lambda: "the WAL cannot be checkpointed yet: database or disk is full" in worker.log(),
            timeout=30,
            what="the worker to say the disk is full and the WAL cannot be checkpointed",
        )
        stuck = _succeeded(database)
        time.sleep(3)
        assert _succeeded(database) == stuck < total, "writes stay refused while the disk is full"
        assert worker.proc.poll() is None, f"the worker died on a full disk\n{worker.log()}"
        assert database.stat().st_size < file_size + GROWTH, "the file could not grow"
        with pytest.raises(replayq.StorageUnavailableError, match="full"):
            app.enqueue("deliver", {"n": total, "sink": str(sink)})

        ballast.unlink()
        wait_for_progress(
            lambda: _succeeded(database),
            total,
            stall=30,
            what=f"all {total} jobs to succeed once space is freed",
        )
        ids.append(app.enqueue("deliver", {"n": total, "sink": str(sink)}))
        wait_for(lambda: _succeeded(database) == total + 1, timeout=30, what="a new job to run")
        assert sorted(j.id for j in app.list_jobs(limit=1000)) == sorted(ids)
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects == dict.fromkeys(range(total + 1), 1), "each effect ran once"
        assert worker.proc.poll() is None, "the same worker, no restart"
        assert "Traceback" not in worker.log()
    finally:
        launcher.kill_all()
        app.close()
