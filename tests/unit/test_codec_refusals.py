"""What the codec refuses, on the fast path too: lone surrogates, over-deep nesting, NaN."""

from __future__ import annotations

from typing import Any

import pytest

from replayq import codec
from replayq.errors import PayloadError


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_lone_surrogate_is_refused_naming_its_path() -> None:
    with pytest.raises(PayloadError, match=r"payload\.note: .* lone surrogate"):
        codec.dumps({"note": "ok \ud800"}, what="payload")


def test_a_lone_surrogate_in_a_key_is_refused() -> None:
    with pytest.raises(PayloadError, match="lone surrogate"):
        codec.dumps({"k\udfff": 1}, what="payload")


def test_nesting_deeper_than_the_limit_is_refused_and_at_the_limit_accepted() -> None:
    with pytest.raises(PayloadError, match="nested more than"):
        codec.dumps(nested(10_000), what="payload")
    assert codec.loads(codec.dumps(nested(codec.MAX_DEPTH))) == nested(codec.MAX_DEPTH)


def test_non_ascii_text_is_kept_exactly() -> None:
    value = {"name": "Zoë 🚚", "城市": "東京"}
    assert codec.loads(codec.dumps(value)) == value


def test_nan_is_refused() -> None:
    with pytest.raises(PayloadError, match="NaN"):
        codec.dumps({"x": float("nan")}, what="payload")
