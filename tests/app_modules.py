"""An application module a test writes to a directory, imported in the test's process and
run by a real ``replayq worker --burst`` process (tests/integration/test_sqlite_pack_*)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import replayq

REPLAYQ = str(Path(sys.executable).with_name("replayq"))


def imported_app(
    directory: Path, name: str, source: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> replayq.App:
    """Module ``name`` (``source``) written to ``directory`` and imported here, with ``env``
    set for it (its database URL): its ``app``."""
    (directory / f"{name}.py").write_text(source)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: replayq.App = module.app
    return app


def burst(directory: Path, db: Path, name: str, env: dict[str, str]) -> None:
    """``replayq worker --burst`` (one executor) on ``db`` with module ``name``'s app."""
    # The tree under test first (as this process imports it), then the application.
    path = os.pathsep.join([*sys.path, str(directory)])
    done = subprocess.run(
        [REPLAYQ, "--db", f"sqlite:///{db}", "worker", "--app", f"{name}:app", "--burst",
         "--concurrency", "1"],
        cwd=directory, env={**os.environ, **env, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
