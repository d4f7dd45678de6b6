"""What the codec refuses, on the fast path too: lone surrogates, over-deep nesting, NaN."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_non_string_key_of_a_flat_object_in_a_list_is_refused() -> None:
    # Flat objects in a list are judged without a call each (the response-lines shape).
    lines: list[Any] = [{"sku": "A", "qty": 1} for _ in range(20)]
    lines[13] = {"sku": "A", 2: 1}
    with pytest.raises(PayloadError, match=r"payload\[13\]: object key 2 is not a string"):
        codec.dumps(lines, what="payload")
    # A flat object at the depth limit is accepted, one level deeper refused.
    at_limit: Any = {"k": 1}
    for _ in range(codec.MAX_DEPTH):
        at_limit = [at_limit]
    assert codec.loads(codec.dumps(at_limit)) == at_limit
    with pytest.raises(PayloadError, match="nested more than"):
        codec.dumps([at_limit], what="payload")


def test_non_ascii_text_is_kept_exactly() -> None:
    value = {"name": "Zoë 🚚", "城市": "東京"}
    assert codec.loads(codec.dumps(value)) == value


def test_nan_is_refused() -> None:
    with pytest.raises(PayloadError, match="NaN"):
        codec.dumps({"x": float("nan")}, what="payload")


# JSON-ish values with the shapes the fast path must judge as the full walk does:
# non-string keys, NaN, lone surrogates, tuples, nesting.
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.sampled_from("ab\u00e9\ud800\udfff")),
)
_KEY = st.one_of(st.text(alphabet="abc\ud800", max_size=3), st.integers(0, 3), st.none())
_VALUE = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_KEY, inner, max_size=3),
    ),
    max_leaves=12,
)


@given(_VALUE)
@settings(max_examples=300, deadline=None)
def test_dumps_refuses_exactly_what_the_full_walk_refuses(value: Any) -> None:
    """The fast path (shape walk, C encoder, text check) stores a value only if every
    rule of the walk over each element holds, and names the same path when one fails."""
    try:
        codec._check(value, "v")
    except PayloadError as expected:
        with pytest.raises(PayloadError) as refused:
            codec.dumps(value, what="v")
        assert str(refused.value) == str(expected)
    else:
        assert codec.loads(codec.dumps(value)) == codec.loads(codec._ENCODER.encode(value))
