"""Durations: seconds or strings such as ``"30s"``; a malformed one names the setting."""

from __future__ import annotations

import pytest

from replayq.durations import format_duration, parse_duration
from replayq.errors import ConfigurationError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (0.25, 0.25),
        ("30", 30.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 10 s ", 10.0),
    ],
)
def test_durations_read_as_seconds(value: float | str, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "fast", "5 minutes", "-1s", "1e3s", "s", True, None])
def test_malformed_duration_is_rejected_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigurationError, match="ship_order: lease"):
        parse_duration(value, name="ship_order: lease")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "0.25s"), (30, "30s"), (300, "5m"), (330, "5m30s"), (5400, "1h30m"), (7200, "2h")],
)
def test_durations_format_compactly_for_humans(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
