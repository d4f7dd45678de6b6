"""The README's tour and docs/tutorial.md run as written: their blocks, in order, in a
fresh temp dir.

* A ```` ```python ```` block whose first line is ``# examples/NAME`` must be that file
  of ``examples/`` exactly, and is written to the temp dir as ``NAME``.
* A ```` ```console ```` block is a session: ``$ command`` lines run in a shell (``export``
  sets the environment of the later ones); the lines under a command are what its
  output (stdout and stderr) must show, in order, where ``...`` matches anything.
  ``fork-…`` in a command stands for the fork trace id an earlier output printed, as
  a reader would copy it.

The tutorial's ```` ```sh ```` blocks carry no output, only comments: each command runs
(exit 0) and ``TUTORIAL_SHOWS`` holds what the prose around it says it shows. Its
install lines (``pip install``, ``mkdir``/``cd``, ``cp path/to/...``) are what the temp
dir already is. Its ```` ```python ```` block (typed payloads, ``async def``) is a
fragment of ``shop.py``'s world: it runs after ``from shop import app`` with a stand-in
``payments`` client, and must end with the ``PayloadError`` its last comment shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)


def tour_blocks() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## A two-minute tour")
    end = readme.index("\n## ", start + 1)
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(readme[start:end])]


def session(text: str) -> list[Command]:
    commands: list[Command] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:]))
        elif line.strip():
            commands[-1].expected.append(line.strip())
    return commands


def pattern(expected: str) -> re.Pattern[str]:
    parts = re.split(r"\.\.\.|…", expected)
    return re.compile(".*".join(re.escape(part) for part in parts))


def assert_shows(output: str, command: Command) -> None:
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for expected in command.expected:
        wanted = pattern(expected)
        while at < len(lines) and not wanted.fullmatch(lines[at]):
            at += 1
        assert at < len(lines), f"$ {command.line}\nshould show: {expected}\ngot:\n{output}"
        at += 1


def test_the_readme_tour_runs_in_order_and_shows_what_it_says(tmp_path: Path) -> None:
    blocks = tour_blocks()
    assert [kind for kind, _ in blocks].count("console") >= 1
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_DB"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    printed = ""
    ran = 0
    for kind, text in blocks:
        if kind == "python":
            first, _, body = text.partition("\n")
            name = first.removeprefix("# examples/")
            assert first.startswith("# examples/"), f"a python block names its file: {first}"
            assert body == (ROOT / "examples" / name).read_text(), f"README differs from {name}"
            (tmp_path / name).write_text(body)
            continue
        assert kind == "console", kind
        for command in session(text):
            if command.line.startswith("export "):
                key, _, value = command.line.removeprefix("export ").partition("=")
                env[key] = value
                continue
            forks = re.findall(r"fork-[0-9a-f]{8,}", printed)
            line = command.line.replace("fork-…", forks[-1] if forks else "fork-…")
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"$ {line}\n{output}"
            assert_shows(output, command)
            printed += output
            ran += 1
    assert ran >= 10, "the tour's commands ran"


TUTORIAL_SHOWS = {
    "python seed.py": ["enqueued job 1"],
    "replayq worker": ["worker ...: leased=1 ..."],
    "replayq dead list": ["2  ship_order ... dead ... not_retryable: [validation] ..."],
    "replayq trace show 2": ["... decision ... decision=ship value=False ...", "... job.dead ..."],
    "replayq dead requeue 2": ["job 2 requeued"],
    "replayq trace resource order:124": [
        "... job 2  #1  lock.acquired ... order:124 ...",
        "... job 2  #1  state.read ... order:124@v1 ...",
        "... job 2  #2  lock.acquired ... order:124 ...",
        "... job 2  #2  state.read ... order:124@v2 ...",
    ],
    "replayq replay 1": ["no divergence: ..."],
    "replayq fork 1": ["fork of job 1 attempt 1 with v3", "compare: replayq diff 1 fork-..."],
    "replayq diff 1": [
        "carrier:  a=None  b=['express']",
        "warehouse.create_shipment ...:  a=succeeded 1  b=succeeded 1",
    ],
    "python -m pytest": ["1 passed ..."],
}
INSTALLED = ("pip install ", "mkdir ", "cp path/to/")
PAYMENTS = """
import replayq
from shop import app


class Payments:
    async def refund(self, order_id: int, amount: str) -> dict:
        return {"id": f"rf-{order_id}-{amount}"}


payments = Payments()
"""


def sh_commands(text: str) -> list[str]:
    """A ```` ```sh ```` block's commands: a line, or lines joined while a quote is open."""
    commands: list[str] = []
    pending = ""
    for line in text.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.count('"') % 2 == 0:
            if pending.strip():
                commands.append(pending)
            pending = ""
    return commands


def test_the_tutorial_runs_in_order_and_shows_what_it_says(tmp_path: Path) -> None:
    tutorial = ROOT / "docs" / "tutorial.md"
    blocks = [(m.group(1), m.group(2)) for m in BLOCK.finditer(tutorial.read_text())]
    for name in ("shop.py", "seed.py", "test_shop.py"):
        (tmp_path / name).write_text((ROOT / "examples" / name).read_text())
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_DB"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    printed = ""
    shown = set()
    for kind, text in blocks:
        if kind == "python":
            *_, last = [line for line in text.splitlines() if line.strip()]
            assert last.startswith("# PayloadError: "), last
            (tmp_path / "typed.py").write_text(PAYMENTS + text)
            done = subprocess.run(
                [sys.executable, "typed.py"], cwd=tmp_path, env=env, capture_output=True, text=True
            )
            assert done.returncode == 1, done.stdout + done.stderr
            *_, error = done.stderr.strip().splitlines()
            assert pattern(last.removeprefix("# ")).fullmatch(
                error.removeprefix("replayq.errors.")
            ), error
            continue
        assert kind == "sh", kind
        for line in sh_commands(text):
            command = line.split("  #", 1)[0].strip()
            if command.startswith(INSTALLED):
                continue
            if command.startswith("export "):
                key, _, value = command.removeprefix("export ").partition("=")
                env[key] = value
                continue
            forks = re.findall(r"fork-[0-9a-f]{8,}", printed)
            command = command.replace("fork-…", forks[-1] if forks else "fork-…")
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"$ {command}\n{output}"
            printed += output
            for start, expected in TUTORIAL_SHOWS.items():
                if command.startswith(start):
                    assert_shows(output, Command(command, expected))
                    shown.add(start)
    assert shown == set(TUTORIAL_SHOWS), set(TUTORIAL_SHOWS) - shown
