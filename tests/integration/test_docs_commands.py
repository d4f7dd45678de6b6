"""Every ``replayq`` command the user-facing docs name exists, with every flag they give it.

Read from the docs' code blocks and inline code: a line or span starting ``replayq``
(or ``$ replayq``) is walked down click's command tree as far as its words name
subcommands; each ``--flag`` after that must be an option of the command reached
(``[--sample 5000]`` counts: an optional flag is still a flag). Error lines a doc
shows under a command (``error: ...``) are not commands and are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from replayq.cli import main

ROOT = Path(__file__).resolve().parents[2]
# docs/reference/api.md is generated from the docstrings (``jobs requeue|cancel|dry-run``).
DOCS = [
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if p.name != "api.md"),
]
WALKED = {"README.md", "docs/tutorial.md", "docs/contracts.md", "docs/rollout.md"}
FENCE = re.compile(r"^```\w*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`(replayq [^`]+)`")


def commands(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    found = [span for span in SPAN.findall(FENCE.sub("", text))]
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")  # a console session's prompt
            if line.startswith("replayq "):
                found.append(line.split("#", 1)[0].split(">", 1)[0])
    return found


def resolve(line: str) -> tuple[click.Command, list[str], list[str], list[str]]:
    """The command ``line`` names, the path to it, the flags it gives that command and
    the words after the path."""
    words = line.split()[1:]
    command: click.Command = main
    path = ["replayq"]
    at = 0
    while at < len(words):
        word = words[at]
        if word == "--db":  # the one global option: it takes a value
            at += 2
            continue
        sub = (
            command.get_command(click.Context(command), word)
            if isinstance(command, click.Group)
            else None
        )
        if sub is not None:
            command = sub
            path.append(word)
            at += 1
            continue
        break
    flags = [re.sub(r"[\[\]]|=.*$", "", w) for w in words[at:] if w.lstrip("[").startswith("--")]
    return command, path, flags, words[at:]


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_and_flag_a_doc_names_exists(doc: str) -> None:
    named = commands(doc)
    assert named or doc not in WALKED, f"{doc} names no replayq command"
    wrong = []
    for line in named:
        command, path, flags, rest = resolve(line)
        words = [word for word in rest if not word.lstrip("[").startswith("-")]
        if isinstance(command, click.Group) and words:  # a bare group is named as a whole
            wrong.append(f"{line!r}: no such command under {' '.join(path)}")
            continue
        options = {opt for param in command.params for opt in param.opts}
        options.add("--help")
        wrong += [
            f"{line!r}: {' '.join(path)} has no option {flag}"
            for flag in flags
            if flag not in options
        ]
    assert not wrong, "\n".join(wrong)
