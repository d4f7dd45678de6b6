"""The demo's machinery: its database, its service and worker processes, its output."""

from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from replayq import JobState, ReplayqError

APP_SPEC = "replayq.demo.shop.app:app"
SERVICES = ("warehouse", "payment", "email")
SERVICE_ENV = {
    "warehouse": "SHOP_WAREHOUSE_URL",
    "payment": "SHOP_PAYMENT_URL",
    "email": "SHOP_EMAIL_URL",
}
INCIDENT_ORDER = 1001
FIXED_ORDER = 1002
SLOW_WAREHOUSE_SECONDS = 3.0
SETTLED = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)

T = TypeVar("T")


class DemoError(ReplayqError):
    """The demo could not run, or a fact it relies on did not hold."""


@dataclass
class DemoResult:
    """The facts the demo established, each read from a service counter or the database."""

    db_url: str
    seconds: float = 0.0
    order_id: int = INCIDENT_ORDER
    job_id: int = 0
    resent_job_id: int = 0
    workers_by_attempt: dict[int, str] = field(default_factory=dict)
    shipments_v1: int = 0
    emails_v1: int = 0
    lease_expired_between: bool = False
    resource_workers: list[str] = field(default_factory=list)
    cache_before: tuple[Any, int | None] | None = None
    order_version_before: int = 0
    cache_stale_before: bool = False
    lint_rules: list[str] = field(default_factory=list)
    dry_run_requests: dict[str, int] = field(default_factory=dict)
    fork_requests: dict[str, int] = field(default_factory=dict)
    fork_trace_id: str = ""
    original_shipments_intended: int = 0
    fork_shipments_intended: int = 0
    fork_cache_consistent: bool = False
    late_writes_fenced: list[str] = field(default_factory=list)
    rollback_would_restore: list[str] = field(default_factory=lambda: ["?"])
    order_after_repair: dict[str, Any] = field(default_factory=dict)
    order_version_after_repair: int = 0
    cache_after_repair: tuple[Any, int | None] | None = None
    cache_consistent_after_repair: bool = False
    v2_job_id: int = 0
    resend_deduplicated: bool = False
    shipments_v2: int = 0
    v2_redeliveries: int = 0
    v2_cache_consistent: bool = False
    case: dict[str, Any] = field(default_factory=dict)
    regression_v2_passes: bool = False
    regression_v1_divergence: str | None = None
    folder: str = ""
    pids: list[int] = field(default_factory=list)
    kept: str | None = None


def replayq_command() -> list[str]:
    """How to run this virtualenv's ``replayq`` console script."""
    script = Path(sys.executable).with_name("replayq")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from replayq.cli import main; main()"]


def wait_for(condition: Callable[[], T], *, timeout: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy; ``DemoError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(0.03)


def http_json(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET (or POST ``body`` to) a local service; its JSON reply."""
    data = json.dumps(body).encode() if body is not None else None
    # Only the demo's own services on 127.0.0.1 are opened here.
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 (as above)
        answer = json.loads(reply.read())
    assert isinstance(answer, dict)
    return answer


class Database:
    """The demo's database: a temporary SQLite file, or a fresh PostgreSQL schema."""

    def __init__(self, given: str | None, folder: Path) -> None:
        self.schema: str | None = None
        self._admin_url = given
        if given is None:
            self.url = f"sqlite:///{folder / 'shop.db'}"
        elif given.startswith("postgresql") and "search_path" not in given:
            self.schema = f"replayq_demo_{uuid.uuid4().hex[:10]}"
            self._admin(f'CREATE SCHEMA "{self.schema}"')
            sep = "&" if "?" in given else "?"
            self.url = f"{given}{sep}options=-csearch_path%3D{self.schema}"
        else:
            self.url = given

    def _admin(self, statement: str) -> None:
        import psycopg

        assert self._admin_url is not None
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            conn.execute(statement.encode())

    def drop(self) -> None:
        if self.schema is not None:
            self._admin(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class Demo:
    """One run: processes, printing, and the facts gathered on the way."""

    def __init__(self, db_url: str | None, keep: bool, out: IO[str]) -> None:
        self.keep = keep
        self.out = out
        self.started = time.monotonic()
        self.folder = Path(tempfile.mkdtemp(prefix="replayq-demo-"))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.services: dict[str, str] = {}
        self.db = Database(db_url, self.folder)
        self.result = DemoResult(db_url=self.db.url, folder=str(self.folder))
        self.env = {
            **os.environ,
            "REPLAYQ_DB": self.db.url,
            "SHOP_SHIP_ORDER_VERSION": "v1",
        }

    # -- printing ---------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def section(self, title: str) -> None:
        self.say()
        self.say(f"== {title} " + "=" * max(3, 74 - len(title)))

    def clock(self) -> str:
        return f"[{time.monotonic() - self.started:5.1f}s]"

    # -- processes --------------------------------------------------------------------------

    def _log(self, name: str) -> IO[bytes]:
        sink = (self.folder / f"{name}.log").open("wb")
        self.logs.append(sink)
        return sink

    def start_service(self, kind: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "replayq.demo.shop.services", kind],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._log(f"service-{kind}"),
        )
        self.processes.append(proc)
        self.result.pids.append(proc.pid)
        assert proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=15)
        selector.close()
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("READY "):
            raise DemoError(f"the {kind} service did not start (see {self.folder})")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        self.services[kind] = url
        self.env[SERVICE_ENV[kind]] = url
        os.environ[SERVICE_ENV[kind]] = url  # the in-process app's clients (never used here)
        self.say(f"  {kind:<9} http://127.0.0.1:{url.rsplit(':', 1)[1]}  (pid {proc.pid})")
        return url

    def start_worker(self, worker_id: str, version: str) -> subprocess.Popen[bytes]:
        argv = [
            *replayq_command(),
            "--db",
            self.db.url,
            "worker",
            "--app",
            APP_SPEC,
            "--worker-id",
            worker_id,
            "--poll-interval",
            "0.05",
            "--grace",
            "5",
        ]
        env = {**self.env, "SHOP_SHIP_ORDER_VERSION": version}
        proc = subprocess.Popen(
            argv, cwd=self.folder, env=env, stdout=self._log(worker_id), stderr=subprocess.STDOUT
        )
        self.processes.append(proc)
        self.result.pids.append(proc.pid)
        self.say(
            f"  $ SHOP_SHIP_ORDER_VERSION={version} replayq worker --app {APP_SPEC} "
            f"--worker-id {worker_id}   (pid {proc.pid})"
        )
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        """SIGTERM (a worker finishes gracefully), then SIGKILL if it lingers."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def cleanup(self) -> None:
        for proc in reversed(self.processes):
            try:
                self.stop(proc, timeout=3.0)
            except Exception:  # best effort: keep cleaning up
                proc.kill()
        for proc in self.processes:
            if proc.stdout is not None:
                proc.stdout.close()
        for sink in self.logs:
            sink.close()
        if self.keep:
            self.result.kept = str(self.folder)
            return
        try:
            self.db.drop()
        except Exception as exc:  # cleanup must not hide the run's own error
            self.say(f"warning: could not drop schema {self.db.schema}: {exc}")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def dump_logs(self, lines: int = 15) -> None:
        """After a failure: the end of every process log, before they are deleted."""
        for log in sorted(self.folder.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                self.say(f"--- {log.name} (last {len(tail)} lines) ---")
                for line in tail:
                    self.say(f"  {line}")

    def counts(self) -> dict[str, dict[str, Any]]:
        return {kind: http_json(f"{url}/_counts") for kind, url in self.services.items()}

    def requests(self) -> dict[str, int]:
        return {kind: int(c["requests"]) for kind, c in self.counts().items()}

    def show_counts(self, label: str) -> dict[str, int]:
        found = self.requests()
        listed = ", ".join(f"{k}={v}" for k, v in found.items())
        self.say(f"  requests received by the real services {label}: {listed}")
        return found

    def cli(
        self, *args: str, ok: tuple[int, ...] = (0,), shown: str | None = None, note: str = ""
    ) -> str:
        """Print the command a user would type, run it, print its output; returns stdout."""
        self.say()
        self.say(f"  $ replayq {shown or shlex.join(args)}")
        done = subprocess.run(
            [*replayq_command(), *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if shown is None:
            for line in (done.stdout + done.stderr).rstrip().splitlines():
                self.say(f"    {line}")
        if done.returncode not in ok:
            raise DemoError(
                f"`replayq {shlex.join(args)}` exited {done.returncode}:\n{done.stderr}"
            )
        if done.returncode != 0:
            self.say(f"    (exit {done.returncode}: {note})")
        return done.stdout
