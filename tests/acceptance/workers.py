"""Real worker subprocesses for acceptance tests, and waiting for conditions with deadlines.

A worker is started exactly as a user starts one: the ``replayq`` console
script of this virtualenv, ``--db`` pointing at a real SQLite file or a
PostgreSQL schema and ``--app`` naming a module under ``tests/apps``. Its stdout and stderr go to
files (never pipes, which can fill and stall the worker) so a failing test can
show them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAYQ = str(Path(sys.executable).with_name("replayq"))

T = TypeVar("T")


def run_cli(
    url: str,
    *args: str,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``replayq --db URL ARGS`` in a fresh process, output captured (a short command).

    ``env`` is added to this process's environment, without the variables whose names
    start with one of ``unset`` (``OTEL_``: nothing of the caller's OpenTelemetry set-up).
    """
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    return subprocess.run(
        [REPLAYQ, "--db", url, *args],
        cwd=ROOT,
        env={**inherited, "PYTHONPATH": python_path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(condition: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(interval)


def wait_for_progress(
    count: Callable[[], int], target: int, *, stall: float, what: str, interval: float = 0.2
) -> None:
    """Poll ``count`` until it reaches ``target``; fail naming ``what`` and the count reached
    once it has not grown for ``stall`` seconds (a slow machine passes, a stuck worker fails)."""
    best = count()
    moved = time.monotonic()
    while best < target:
        time.sleep(interval)
        now = count()
        if now > best:
            best, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(
                f"no progress for {stall}s at {best} of {target} waiting for: {what}"
            )


def read_lines(log: Path) -> list[dict[str, Any]]:
    """The JSON lines a test app's handler appended to its side file."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@dataclass
class WorkerProcess:
    """One ``replayq worker`` subprocess."""

    worker_id: str
    proc: subprocess.Popen[bytes]
    output: Path
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        """Send ``signum``; for SIGSTOP, return only once every thread has stopped.

        ``kill(2)`` returns before the target stops: on a busy machine the worker can
        run on another core for a while after, and take a lock a caller has just
        probed as free.
        """
        self.proc.send_signal(signum)
        if signum == signal.SIGSTOP:
            self.wait_stopped()
        elif signum == signal.SIGCONT:
            self.stopped = False

    def wait_stopped(self, timeout: float = 10) -> None:
        """Return once every thread has stopped: after ``signal(SIGSTOP)``, or a stop the
        process sent itself (a test app's fault hook)."""
        self.stopped = True
        wait_for(self._all_threads_stopped, timeout=timeout, what=f"{self.worker_id} to stop")

    def _all_threads_stopped(self) -> bool:
        """Whether every thread of the process is in state ``T`` (stopped by a signal)."""
        for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
            try:
                text = stat.read_text()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            if text.rpartition(")")[2].split()[0] not in ("T", "t"):
                return False
        return True

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.worker_id} did not exit within {timeout}s\n{self.log()}"
            ) from None

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def kill(self) -> None:
        """SIGKILL this process (and only it) if it is still running."""
        if self.proc.poll() is None:
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class WorkerLauncher:
    """Starts workers on one database; kills whatever is left at teardown.

    ``database``: a SQLite file, or a database URL (a PostgreSQL schema's).
    """

    database: Path | str
    directory: Path
    started: list[WorkerProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        if isinstance(self.database, Path):
            return f"sqlite:///{self.database}"
        return self.database

    @property
    def backend(self) -> str:
        return "sqlite" if self.url.startswith("sqlite") else "postgres"

    def start(
        self,
        worker_id: str,
        *,
        app: str = "tests.apps.sleepy:app",
        concurrency: int = 1,
        grace: float = 10.0,
        burst: bool = False,
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
    ) -> WorkerProcess:
        argv = [
            REPLAYQ,
            "--db",
            self.url,
            "worker",
            "--app",
            app,
            "--worker-id",
            worker_id,
            "--concurrency",
            str(concurrency),
            "--grace",
            str(grace),
            "--poll-interval",
            "0.05",
        ]
        if burst:
            argv.append("--burst")
        argv.extend(options)
        output = self.directory / f"worker-{worker_id}.log"
        python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        full_env = {**os.environ, "REPLAYQ_DB": self.url, "PYTHONPATH": python_path, **(env or {})}
        with output.open("wb") as sink:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT
            )
        worker = WorkerProcess(worker_id, proc, output)
        self.started.append(worker)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


# Set by tests/acceptance/conftest.py's pytest_runtest_makereport: did the test's call pass?
CALL_PASSED = pytest.StashKey[bool]()


def show_worker_logs(
    request: pytest.FixtureRequest, workers: Sequence[WorkerProcess], tail: int | None = None
) -> None:
    """Print the workers' logs when the test did not pass (``make chaos`` runs with ``-s``:
    a passing run shows its tables, not thousands of log lines)."""
    if request.node.stash.get(CALL_PASSED, False):
        return
    for worker in workers:
        log = worker.log()[-tail:] if tail else worker.log()
        print(f"--- worker {worker.worker_id} (pid {worker.pid}) ---\n{log}")


@contextmanager
def workers_ended(request: pytest.FixtureRequest, launcher: WorkerLauncher) -> Iterator[None]:
    """The launcher's workers killed when the block ends; if it raised, killed first and
    their logs shown (``show_worker_logs``: complete, as each worker's process ended)."""
    try:
        yield
    except BaseException:
        launcher.kill_all()
        show_worker_logs(request, launcher.started)
        raise
    finally:
        launcher.kill_all()
