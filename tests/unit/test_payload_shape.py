"""Payload checks at enqueue: JSON only, the handler's fields, the contract's size limit."""

from __future__ import annotations

from typing import Any

import pytest

import replayq
from replayq import codec
from replayq.queue.contracts import build_contract
from replayq.queue.handlers import Handler, PayloadShape


def ship(
    ctx: replayq.Context, order_id: int, weight: float, express: bool = False, note: str = ""
) -> None: ...


def accepts_anything(ctx: replayq.Context, order_id: int, **extra: Any) -> None: ...


SHAPE = PayloadShape.from_function(ship)


def test_shape_reads_required_and_optional_fields_after_ctx() -> None:
    assert SHAPE.required == ("order_id", "weight")
    assert SHAPE.optional == ("express", "note")
    assert not SHAPE.accepts_extra


@pytest.mark.parametrize(
    "payload",
    [
        {"order_id": 1, "weight": 2.5},
        {"order_id": 1, "weight": 2},
        {"order_id": 1, "weight": 2.5, "express": True, "note": "x"},
        {"order_id": 1, "weight": 2.5, "note": None},
    ],
)
def test_payload_that_fits_passes(payload: dict[str, Any]) -> None:
    SHAPE.check("ship", payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"weight": 1.0}, "missing required field 'order_id'"),
        ({"order_id": 1, "weight": 1.0, "colour": "red"}, "unknown field 'colour'"),
        ({"order_id": "1", "weight": 1.0}, "field 'order_id' expects int"),
        ({"order_id": True, "weight": 1.0}, "field 'order_id' expects int"),
        ({"order_id": 1, "weight": "heavy"}, "field 'weight' expects float"),
        ({"order_id": 1, "weight": 1.0, "express": "yes"}, "field 'express' expects bool"),
    ],
)
def test_payload_that_does_not_fit_names_the_field(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(replayq.PayloadError, match=message):
        SHAPE.check("ship", payload)


def test_var_keyword_handler_accepts_extra_fields() -> None:
    PayloadShape.from_function(accepts_anything).check("any", {"order_id": 1, "more": [1]})


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"when": object()}, r"payload\.when"),
        ({"tags": {"a"}}, r"payload\.tags"),
        ({"items": [1, b"raw"]}, r"payload\.items\[1\]"),
        ({"nested": {"x": float("inf")}}, r"payload\.nested\.x"),
        ({"keys": {1: "one"}}, r"payload\.keys"),
    ],
)
def test_non_json_values_are_rejected_naming_their_path(value: Any, path: str) -> None:
    with pytest.raises(replayq.PayloadError, match=path):
        codec.dumps(value, what="payload")


def test_json_encoding_is_canonical() -> None:
    assert codec.dumps({"b": 1, "a": [1, 2.5, None, "é"]}) == '{"a":[1,2.5,null,"é"],"b":1}'
    assert codec.fingerprint({"a": 1, "b": 2}) == codec.fingerprint({"b": 2, "a": 1})


def test_encoded_payload_above_max_payload_bytes_is_rejected_naming_the_limit() -> None:
    contract = build_contract("ship", fields=SHAPE.fields, max_payload_bytes=64)
    handler = Handler(contract, ship, SHAPE, {})
    handler.encode_payload({"order_id": 1, "weight": 1.0, "note": "x" * 20})
    with pytest.raises(replayq.PayloadError, match="max_payload_bytes=64"):
        handler.encode_payload({"order_id": 1, "weight": 1.0, "note": "x" * 64})
    with pytest.raises(replayq.PayloadError, match="max_payload_bytes=64"):
        handler.encode_payload({"order_id": 1, "weight": 1.0, "note": "é" * 30})  # bytes, not chars
