"""orjson encodes for the codec only where its text is the standard encoder's, byte for byte.

Canonical text is what fingerprints, stored versions and pack items are made of: a value
must encode to the same bytes with and without the [fast] extra, and the codec must refuse
what it refused before (NaN, non-JSON types) although orjson would write them.
"""

from __future__ import annotations

import enum
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayq import codec
from replayq.errors import PayloadError

pytest.importorskip("orjson")

STANDARD = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode

# Floats of every magnitude (tiny ones are where orjson's notation differs), texts that
# look like numbers or hold escapes, integers past 64 bits.
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-5, 2.5e-7, 1e-4, 9.99e-5, 5e-324, 1e16, 1e15, -0.0, 0.1])
    | st.text(max_size=12)
    | st.sampled_from(['x:1e-5,"', "0.00001", "a,0.00001]", "\\", '"', "\u2028", "\x7f"])
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=3000, deadline=None)
@given(values)
def test_every_value_encodes_to_the_standard_encoders_bytes(value: Any) -> None:
    try:
        expected = STANDARD(value)
    except ValueError:  # a lone surrogate in a generated text is refused either way
        with pytest.raises(PayloadError):
            codec.dumps(value)
        return
    if not expected.isascii() and not codec._utf8(expected):
        return  # lone surrogate: refused by dumps (test_codec_refusals)
    assert codec.dumps(value) == expected
    assert codec.dumps_own(value) == expected
    assert codec.fingerprint(value) == codec.fingerprint_text(expected)


def test_a_plain_value_takes_orjson_and_tiny_floats_take_the_standard_path() -> None:
    plain = {"b": [1, 2.5, "ü", True], "a": {"k": 1e16}}
    assert codec._fast_text(plain) == STANDARD(plain)
    # orjson writes 0.00001 and 2.5e-7; the standard encoder 1e-05 and 2.5e-07.
    assert codec._fast_text({"d": 1e-5}) is None
    assert codec._fast_text([2.5e-7]) is None
    assert codec.dumps_own({"d": 1e-5, "e": [2.5e-7]}) == '{"d":1e-05,"e":[2.5e-07]}'


def test_without_orjson_the_text_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    value = {"step_name": "price", "duration": 5.3e-05, "lines": [{"tax": 0.2, "n": None}]}
    fast = (codec.dumps(value), codec.dumps_own(value))
    monkeypatch.setattr(codec, "orjson", None)
    assert codec._fast_text(value) is None
    assert (codec.dumps(value), codec.dumps_own(value)) == fast


class Colour(enum.Enum):
    RED = "red"


class Name(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"price": float("nan")},
        [float("inf")],
        {"id": uuid.UUID(int=1)},  # orjson writes a UUID as text
        {"colour": Colour.RED},  # and an enum member as its value
        {1: "non-string key"},
        # The same inside a list of flat objects (judged in C-level passes, not one by one).
        [{"a": 1}, {"id": uuid.UUID(int=1)}],
        {"lines": [{"a": 1}, {"colour": Colour.RED}]},
        [{"a": 1}, {2: "non-string key"}],
    ],
)
def test_dumps_still_refuses_what_orjson_would_write(value: Any) -> None:
    with pytest.raises(PayloadError):
        codec.dumps(value)


def test_a_str_subclass_is_written_as_the_standard_encoder_writes_it() -> None:
    value = {"name": Name("x"), "n": 1}
    assert codec.dumps(value) == codec.dumps_own(value) == '{"n":1,"name":"x"}'


def test_orjson_refuses_every_key_that_is_not_exactly_a_str() -> None:
    # ``_plain`` leaves the keys to orjson: a str subclass or a number as a key must make
    # it refuse the value, which then takes the standard path (as a ``False`` did).
    import orjson

    for value in ({Name("k"): 1}, {1: "x"}, [{"a": 1}, {Name("k"): 2}], {"a": {2.5: 1}}):
        with pytest.raises(TypeError):
            orjson.dumps(value, option=codec._FAST_OPTIONS)
        assert codec._fast_text(value) is None
    assert codec.dumps({Name("k"): 1}) == STANDARD({Name("k"): 1}) == '{"k":1}'


@settings(max_examples=1500, deadline=None)
@given(values)
def test_dumps_keyed_is_dumps_with_the_keys_keys_of_finds(value: Any) -> None:
    from replayq import redaction

    try:
        text = codec.dumps(value)
    except PayloadError:
        with pytest.raises(PayloadError):
            codec.dumps_keyed(value)
        return
    keyed, keys = codec.dumps_keyed(value)
    assert keyed == text
    assert keys is None or keys == redaction.keys_of(value)
