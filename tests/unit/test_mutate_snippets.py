"""``make mutate`` plants each named bug where its snippet occurs: a refactor that moves
the code must move the snippet too, or the mutation run stops before planting anything."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_planted_bug_finds_its_snippet_exactly_once() -> None:
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    mutate = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = mutate
    try:
        spec.loader.exec_module(mutate)
        assert len(mutate.BUGS) >= 20
        for bug in mutate.BUGS:
            mutate.locate(ROOT, bug)  # raises SystemExit naming the bug when not found once
    finally:
        sys.modules.pop("mutate", None)
