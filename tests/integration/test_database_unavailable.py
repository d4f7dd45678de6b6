"""A database that cannot be opened gives one clear error, from the API and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import replayq
from replayq.cli import main


def unopenable(tmp_path: Path, kind: str) -> str:
    if kind == "missing-directory":
        return f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'q.db'}"
    if kind == "directory":
        return f"sqlite:///{tmp_path}"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an SQLite database\n" * 200)
    return f"sqlite:///{garbage}"


KINDS = ["missing-directory", "directory", "not-a-database"]


@pytest.mark.parametrize("kind", KINDS)
def test_unopenable_database_raises_database_unavailable_naming_the_path(
    tmp_path: Path, kind: str
) -> None:
    url = unopenable(tmp_path, kind)
    app = replayq.App(url)
    with pytest.raises(
        replayq.DatabaseUnavailableError, match="cannot open SQLite database"
    ) as info:
        app.list_jobs()
    assert url.removeprefix("sqlite:///") in str(info.value)
    app.close()


@pytest.mark.parametrize("kind", KINDS)
def test_cli_prints_one_error_line_and_exits_3_when_the_database_cannot_be_opened(
    tmp_path: Path, kind: str
) -> None:
    url = unopenable(tmp_path, kind)
    result = CliRunner().invoke(main, ["--db", url, "jobs", "list"])
    assert result.exit_code == 3, (
        "storage unavailable, in the exit-code table (docs/reliability.md)"
    )
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot open SQLite database")
    assert "Traceback" not in result.output


def test_unknown_url_scheme_is_a_configuration_error() -> None:
    with pytest.raises(replayq.ConfigurationError, match="'mysql'"):
        replayq.App("mysql://db/queue").list_jobs()
