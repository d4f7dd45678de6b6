"""Durations as contracts write them: seconds as numbers, or strings like ``"30s"``, ``"5m"``."""

from __future__ import annotations

import math
import re

from replayq.errors import ConfigurationError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")

Duration = float | int | str


def parse_duration(value: Duration, *, name: str = "duration") -> float:
    """Return ``value`` in seconds; raise ``ConfigurationError`` naming ``name`` if malformed."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{name}: expected seconds or a string like '30s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ConfigurationError(f"{name}: {value!r} is not a finite number of seconds")
        return seconds
    match = _PATTERN.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(
            f"{name}: cannot read {value!r} as a duration; "
            "use seconds or '500ms', '30s', '5m', '1h'"
        )
    number, unit = match.groups()
    seconds = float(number) * _UNITS[unit or "s"]
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name}: {value!r} is not a finite number of seconds")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for humans: ``0.25s``, ``30s``, ``5m``, ``1h30m``."""
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{int(minutes)}m" + (f"{secs:g}s" if secs else "")
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h" + (f"{int(minutes)}m" if minutes else "")
