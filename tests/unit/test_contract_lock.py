"""``replayq contract freeze`` / ``check``: the lock file catches a silently changed contract."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from replayq.cli.main import main

APP = """\
import replayq

app = replayq.App("sqlite:///{db}")

@app.job("charge", version="v1", lease="{lease}", lock="order:{{order}}", lock_ttl="{lock_ttl}",
         retry=replayq.Retry(max_attempts=5, on=("transient",)))
def charge(ctx, order: int):
    return order
"""


def write_app(tmp_path: Path, lease: str, lock_ttl: str = "60s") -> str:
    """A fresh module (a new name each time: the import cache never hides a change)."""
    name = f"lockapp_{uuid.uuid4().hex[:8]}"
    body = APP.format(db=tmp_path / "app.db", lease=lease, lock_ttl=lock_ttl)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return f"{name}:app"


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return CliRunner()


def test_check_fails_on_a_changed_lease_with_the_field_and_passes_after_freeze(
    runner: CliRunner, tmp_path: Path
) -> None:
    frozen_with = write_app(tmp_path, lease="30s")
    result = runner.invoke(main, ["contract", "freeze", "--app", frozen_with])
    assert result.exit_code == 0, result.output
    lock = (tmp_path / "replayq.contracts.lock").read_text()
    assert "[charge v1]" in lock and "lease = 30.0" in lock

    assert runner.invoke(main, ["contract", "check", "--app", frozen_with]).exit_code == 0

    shortened = write_app(tmp_path, lease="10s")
    result = runner.invoke(main, ["contract", "check", "--app", shortened])
    assert result.exit_code == 1
    assert "charge v1: lease (lease / visibility timeout): lock 30.0 -> code 10.0" in result.output

    assert runner.invoke(main, ["contract", "freeze", "--app", shortened]).exit_code == 0
    result = runner.invoke(main, ["contract", "check", "--app", shortened])
    assert result.exit_code == 0, result.output
    assert "contracts match" in result.output


def test_check_names_every_changed_field_as_json(runner: CliRunner, tmp_path: Path) -> None:
    runner.invoke(main, ["contract", "freeze", "--app", write_app(tmp_path, "30s", "60s")])
    changed = write_app(tmp_path, "30s", "90s")
    result = runner.invoke(main, ["contract", "check", "--app", changed, "--json"])
    assert result.exit_code == 1
    assert '"field": "lock_ttl"' in result.output and '"locked": 60.0' in result.output


def test_check_without_a_lock_file_says_how_to_make_one(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["contract", "check", "--app", write_app(tmp_path, "30s")])
    assert result.exit_code == 2
    assert "replayq contract freeze" in result.output


def test_check_of_an_app_declaring_nothing_against_an_empty_lock_is_no_match(
    runner: CliRunner, tmp_path: Path
) -> None:
    """A wrong ``--app`` attribute (an App with no job on it) and an empty lock "matched",
    exit 0: CI passed having compared nothing."""
    (tmp_path / "bare.py").write_text("import replayq\n\napp = replayq.App()\n")
    (tmp_path / "replayq.contracts.lock").write_text("")

    checked = runner.invoke(main, ["contract", "check", "--app", "bare:app"])
    frozen = runner.invoke(main, ["contract", "freeze", "--app", "bare:app"])

    assert checked.exit_code == 2, checked.output
    assert "nothing to check" in checked.output and "contracts match" not in checked.output
    assert frozen.exit_code == 2 and "declares no job type" in frozen.output, frozen.output
    assert (tmp_path / "replayq.contracts.lock").read_text() == ""
