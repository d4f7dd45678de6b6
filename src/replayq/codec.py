"""JSON in and out. replayq stores JSON only — never pickle — in one canonical form."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from replayq.errors import PayloadError


def _check(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path}: {value!r} is not valid JSON (NaN and infinity are not)")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path}: object key {key!r} is not a string")
            _check(item, f"{path}.{key}")
        return
    raise PayloadError(f"{path}: {type(value).__name__} is not JSON-serialisable")


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode canonically (sorted keys, no spaces); ``PayloadError`` names the bad path."""
    _check(value, what)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def loads(text: str | bytes | None) -> Any:
    """Decode JSON text; ``None`` stays ``None``."""
    if text is None:
        return None
    return json.loads(text)


def fingerprint(value: Any) -> str:
    """A short, stable hash of a JSON value, for comparing arguments across runs."""
    return hashlib.sha256(dumps(value).encode()).hexdigest()[:16]
