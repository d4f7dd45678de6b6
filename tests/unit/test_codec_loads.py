"""``codec.loads`` decodes with msgspec first and gives exactly what ``json.loads`` gives:
for every JSON text, including the values msgspec refuses (which take the standard path)
and the errors (raised as ``json.loads`` raises them)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayq import codec

# Every code point, lone surrogates included (a Python ``str`` may hold them).
ANY_CHARACTER = st.characters(codec=None, categories=None)
# Every JSON value, with the integers and floats where decoders disagree most: integers
# past 64 bits, floats at the ends of their range, strings of any code point.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(ANY_CHARACTER),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(ANY_CHARACTER, max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (a != a and b != b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans())
def test_loads_gives_what_json_loads_gives(value: Any, ensure_ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    assert same(codec.loads(text), json.loads(text))
    # As bytes, a lone surrogate too (json.loads decodes bytes with "surrogatepass").
    raw = text.encode("utf-8", "surrogatepass")
    assert same(codec.loads(raw), json.loads(raw))


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',  # the last of duplicate keys
        "123456789012345678901234567890",  # past 64 bits: an int, never a float
        # 20 digits past 2**64: msgspec before 0.19 wrapped these silently (hence >=0.19)
        "19446744073709551617",
        "19999999999999999999",
        "-19999999999999999999",
        "-9223372036854775809",
        "18446744073709551616",
        "-0.0",
        "1e400",  # msgspec refuses: json gives inf
        "NaN",
        "[Infinity, -Infinity]",
        '"\\ud800"',  # a lone surrogate's escape
        '"\\ud83d\\ude00"',
        "1E5",
        "  [1, 2]  ",
        "123456789012345678901234567890.5",
    ],
)
def test_loads_agrees_where_decoders_differ(text: str) -> None:
    assert same(codec.loads(text), json.loads(text))


def test_bytes_in_another_encoding_are_read_as_json_reads_them() -> None:
    text = '{"é": [1, 2.5]}'
    for encoding in ("utf-8", "utf-16", "utf-32"):
        assert codec.loads(text.encode(encoding)) == {"é": [1, 2.5]}


@pytest.mark.parametrize("text", ["[1, 2", "01", "", "{'a': 1}", "[1] [2]"])
def test_malformed_text_raises_what_json_raises(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as raised:
        codec.loads(text)
    assert str(raised.value) == str(expected.value)
