"""The wheel carries everything the demo needs: a fresh virtualenv with only the wheel runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_virtualenv_with_only_the_built_wheel_runs_the_demo(tmp_path: Path) -> None:
    # Build from a clean copy of what git tracks: a build/ folder left in the checkout by an
    # earlier build would put stale files (a renamed migration) into the wheel.
    source = tmp_path / "source"
    source.mkdir()
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "pyproject.toml", "README.md", "src"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, tracked):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The build backend's own warnings (a deprecated licence table printed ~40 lines).
    assert "BuildBackendWarning" not in build.stderr, build.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in build.stderr, build.stderr[-3000:]
    (wheel,) = dist.glob("replayq-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=300
    )

    demo = subprocess.run(
        [str(env_dir / "bin" / "replayq"), "demo"],
        cwd=tmp_path,  # not the checkout: nothing may come from the source tree
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )

    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "assert_replays(case, app, version='v2')  -> passes" in demo.stdout
    assert "What happened:" in demo.stdout
