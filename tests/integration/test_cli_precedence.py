"""Which database the command line uses, and what ``--burst``, ``--version`` and ``--help`` say.

Each command runs in a fresh ``replayq`` process, as a user's would: the app module is
imported anew every time, so what it does at import (open its storage, enqueue) happens
before the command line chooses the database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

import replayq
from replayq.cli import main

REPLAYQ = str(Path(sys.executable).with_name("replayq"))

# An app module that opens its own database at import, by enqueueing there.
MODULE = """
import replayq

app = replayq.App("sqlite:///a.db")

@app.job("hello")
def hello(ctx: replayq.Context, name: str) -> str:
    return f"hello {name}"

app.enqueue("hello", {"name": "from-import"}, message_id="import")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "greet.py").write_text(MODULE)
    return tmp_path


def run(project: Path, *args: str, env_db: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_DB"}
    if env_db is not None:
        env["REPLAYQ_DB"] = env_db
    done = subprocess.run(
        [REPLAYQ, *args], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def states(project: Path, name: str) -> list[tuple[str, str]]:
    app = replayq.App(f"sqlite:///{project / name}")
    try:
        return [(job.payload["name"], job.state.value) for job in app.list_jobs()]
    finally:
        app.close()


def test_db_option_wins_over_a_module_that_opened_its_app_url_at_import(project: Path) -> None:
    run(project, "--db", "sqlite:///b.db", "enqueue", "hello", "--app", "greet:app",
        "--payload", '{"name": "b"}')  # fmt: skip
    run(project, "--db", "sqlite:///b.db", "worker", "--app", "greet:app", "--burst")

    assert states(project, "b.db") == [("b", "succeeded")]
    assert states(project, "a.db") == [("from-import", "queued")], "a.db was only imported"


def test_replayq_db_wins_over_the_app_url_and_db_option_wins_over_both(project: Path) -> None:
    run(project, "enqueue", "hello", "--app", "greet:app", "--payload", '{"name": "env"}',
        env_db="sqlite:///env.db")  # fmt: skip
    run(project, "--db", "sqlite:///flag.db", "enqueue", "hello", "--app", "greet:app",
        "--payload", '{"name": "flag"}', env_db="sqlite:///env.db")  # fmt: skip
    run(project, "worker", "--app", "greet:app", "--burst", env_db="sqlite:///env.db")

    assert states(project, "env.db") == [("env", "succeeded")]
    assert states(project, "flag.db") == [("flag", "queued")]


def test_burst_says_how_many_jobs_are_scheduled_later_and_burst_wait_runs_them(
    project: Path,
) -> None:
    db = "sqlite:///b.db"
    run(project, "--db", db, "enqueue", "hello", "--app", "greet:app",
        "--payload", '{"name": "soon"}', "--delay", "15s")  # fmt: skip
    run(project, "--db", db, "enqueue", "hello", "--app", "greet:app",
        "--payload", '{"name": "later"}', "--delay", "1h")  # fmt: skip

    # 15 s, not 1 s or 4 s: on a loaded machine, starting the enqueue and worker processes
    # took over four seconds and the "soon" job was already due when the first burst looked.
    first = run(project, "--db", db, "worker", "--app", "greet:app", "--burst")
    assert "2 job(s) scheduled later" in first.stderr
    assert "--burst-wait" in first.stderr

    started = time.monotonic()
    waited = run(project, "--db", db, "worker", "--app", "greet:app", "--burst",
                 "--burst-wait", "40", "--poll-interval", "0.05")  # fmt: skip
    assert time.monotonic() - started < 40, "it waited for the 15 s job, not the whole window"
    assert "succeeded=1" in waited.stderr
    assert "1 job(s) scheduled later" in waited.stderr
    assert sorted(states(project, "b.db")) == [("later", "queued"), ("soon", "succeeded")]


def test_version_is_printed_and_is_the_packages() -> None:
    done = subprocess.run([REPLAYQ, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert done.stdout.strip() == f"replayq, version {replayq.__version__}"
    assert replayq.__version__ not in ("", "0+unknown")


def walk(command: click.Command, path: str = "replayq") -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        # list_commands/get_command, not .commands: the root group loads most on demand.
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found += walk(sub, f"{path} {name}")
    return found


def test_every_command_and_option_has_help_text() -> None:
    undocumented = [
        f"{path} {param.opts[0]}"
        for path, command in walk(main)
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    unexplained = [path for path, command in walk(main) if not (command.help or "").strip()]
    assert undocumented == []
    assert unexplained == []
