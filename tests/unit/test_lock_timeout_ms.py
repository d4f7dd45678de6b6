"""A lock change's ``wait`` as PostgreSQL's ``lock_timeout`` (``lock_timeout_ms``).

``break_lock(wait=math.inf)`` (wait as long as it takes) raised ``OverflowError`` on
every backend before it sent anything: ``math.ceil`` of an infinite float. It is now the
setting's largest value, as any wait past it already was.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import replayq
from replayq.storage.context_params import LOCK_TIMEOUT_MAX_MS, lock_timeout_ms


@pytest.mark.parametrize(
    ("wait", "ms"),
    [
        (0.0, 1),
        (0.0001, 1),
        (0.05, 50),
        (10.0, 10_000),
        (1e300, LOCK_TIMEOUT_MAX_MS),
        (math.inf, LOCK_TIMEOUT_MAX_MS),
    ],
)
def test_a_wait_is_whole_milliseconds_within_the_settings_range(wait: float, ms: int) -> None:
    assert lock_timeout_ms(wait) == ms


def test_breaking_a_lock_may_wait_as_long_as_it_takes(tmp_path: Path) -> None:
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", auto_migrate=True)
    try:
        assert replayq.break_lock(app, "nothing-held", reason="r", wait=math.inf) is None
    finally:
        app.close()
