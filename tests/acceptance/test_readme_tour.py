"""The README's tour runs as written: its blocks, in order, in a fresh temp dir.

* A ```` ```python ```` block whose first line is ``# examples/NAME`` must be that file
  of ``examples/`` exactly, and is written to the temp dir as ``NAME``.
* A ```` ```console ```` block is a session: ``$ command`` lines run in a shell (``export``
  sets the environment of the later ones); the lines under a command are what its
  output (stdout and stderr) must show, in order, where ``...`` matches anything.
  ``fork-…`` in a command stands for the fork trace id an earlier output printed, as
  a reader would copy it.
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
