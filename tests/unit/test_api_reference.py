"""docs/reference/api.md is generated from the docstrings and must match them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_reference_matches_the_docstrings() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "api_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_reference_documents_the_public_api_and_its_docstrings() -> None:
    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    assert "### class `App`" in text
    assert "* **`enqueue(self, job_type: str" in text
    assert "### `run_inline`" in text
    assert "Run an external read and record request, response" in text
