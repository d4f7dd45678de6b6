"""Fingerprints recorded by earlier releases still match: replay compares call requests by
them, so a change in canonical JSON (a new encoder, another float format) would make every
recorded ``ctx.call`` diverge. The values below were recorded by replayq at commit 3437183.
"""

from __future__ import annotations

from typing import Any

import pytest

from replayq import codec
from replayq.recording.calls import _summarise_encoded

RECORDED: list[tuple[dict[str, Any], str]] = [
    ({"args": [2, 32], "kwargs": {}}, "dacd23fcd2141d47"),
    (
        {
            "args": [
                {
                    "sku": "SKU-1",
                    "qty": 2,
                    "price": 19.99,
                    "tags": ["ü", "x"],
                    "n": None,
                    "big": 1e16,
                    "neg": -0.5,
                }
            ],
            "kwargs": {"currency": "EUR"},
        },
        "2fcf81927d14ae57",
    ),
]


@pytest.mark.parametrize(("request_", "recorded"), RECORDED)
def test_a_call_request_keeps_the_fingerprint_it_was_recorded_with(
    request_: dict[str, Any], recorded: str
) -> None:
    _, text = _summarise_encoded(request_)
    assert codec.fingerprint_text(text) == recorded
    assert codec.fingerprint(request_) == recorded
