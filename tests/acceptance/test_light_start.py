"""A worker, and ``import replayq``, load none of what only other commands use.

Process start was a quarter of a 5,000-job drain (issue 13): the replay engine,
rollout control, progress bars, cron parsing, the web and metrics stacks and the
installed-metadata reader were imported by every worker and never used by one.
These tests hold the list, not a timing: a timing would flake on a shared machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import replayq
from tests.acceptance.workers import ROOT, run_cli
from tests.apps import loaded_modules

NOT_AT_START = (
    "replayq.replay",  # the replay engine, bulk dry-runs, diffs, reruns, rollbacks
    "replayq.rollout.control",  # changing routing, with its gates and the lock file
    "replayq.rollout.gates",
    "replayq.rollout.lockfile",
    # Verification, shadow runs and routing records: loaded when a type has routing or a
    # verification runs (the worker's start declares replayq.verify through verify_job).
    "replayq.rollout.background",
    "replayq.rollout.routing",
    "replayq.rollout.shadow",
    "replayq.rollout.verify",
    "replayq.rollout.verify_steps",
    "replayq.queue.bulk",  # bulk requeue/cancel: App.bulk and its results, never a worker's
    "replayq.observe.fleet",
    "replayq.observe.metrics",
    "replayq.web",
    "replayq.demo",
    # The command groups a worker never runs (the worker's own is replayq.cli.jobs).
    "replayq.cli.admin",
    "replayq.cli.effects",
    "replayq.cli.events",
    "replayq.cli.metrics",
    "replayq.cli.replay",
    "replayq.cli.retention",
    "replayq.cli.rollout",
    "replayq.cli.schedules",
    "replayq.cli.trace",
    "replayq.cli.web",
    "rich",
    "croniter",
    "urllib.request",
    "opentelemetry",
    "prometheus_client",
    "starlette",
    "uvicorn",
    "jinja2",
    # Hashing (blob references, fingerprints of recorded calls, keyed redaction markers),
    # the login name of an effect's resolution, a sealed subprocess's command line: each
    # imported where it is first needed, never by a plain job's worker.
    "hashlib",
    "hmac",
    "getpass",
    "shlex",
)

ONLY_SQLITE = ("sqlite3",)
"""A PostgreSQL worker needs no ``sqlite3`` (a SQLite connection's own statement limit)."""


UNLESS_PSYCOPG = ("asyncio", "importlib.metadata", "importlib.resources", "socket", "tempfile")
UNLESS_PSYCOPG += ("zoneinfo",)
"""Only an ``async def`` handler, ``--version``, a zip install's SQL files, schedules and
a replay's seal need these (the host name is ``platform.node()``); psycopg imports them
all itself."""


def loaded_of(modules: list[str], names: tuple[str, ...] = NOT_AT_START) -> list[str]:
    """Those of ``modules`` that are, or are under, one of ``names``."""
    return [m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names)]


def test_import_replayq_loads_no_replay_rollout_or_command_code() -> None:
    code = "import json, sys, replayq; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert loaded_of(json.loads(done.stdout), NOT_AT_START + UNLESS_PSYCOPG) == []


def test_the_lazy_public_names_still_import_on_first_use() -> None:
    code = (
        "import json, sys, replayq; replayq.dry_run; replayq.Rollout; replayq.__version__;"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert {"replayq.replay.engine", "replayq.rollout.control"} <= set(json.loads(done.stdout))


def test_a_worker_running_a_job_has_loaded_none_of_it(db_url: str, tmp_path: Path) -> None:
    migrator = replayq.App(db_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's database
    migrator.close()
    app = loaded_modules.build(db_url)
    report = tmp_path / "modules.json"
    app.enqueue("report_modules", {"path": str(report)})
    app.close()

    done = run_cli(db_url, "worker", "--app", "tests.apps.loaded_modules:app", "--burst")

    assert done.returncode == 0, done.stderr
    loaded = json.loads(report.read_text())
    on_sqlite = db_url.startswith("sqlite")
    unloaded = NOT_AT_START + UNLESS_PSYCOPG if on_sqlite else NOT_AT_START + ONLY_SQLITE
    assert loaded_of(loaded, unloaded) == []
