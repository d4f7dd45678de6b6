"""``heartbeat=0`` declares a fixed visibility timeout: a lease that is never extended."""

from __future__ import annotations

import pytest

import replayq
from replayq.queue.contracts import build_contract, diff_contracts


def test_heartbeat_zero_is_a_lease_never_extended() -> None:
    fixed = build_contract("ship", fields=("order_id",), lease="0.5s", heartbeat=0)
    extended = build_contract("ship", fields=("order_id",), lease="4s", heartbeat="0.5s")

    assert fixed.heartbeat == 0
    changes = {c.field: (c.old, c.new, c.concern) for c in diff_contracts(fixed, extended)}
    assert changes["heartbeat"] == (0.0, 0.5, "lease extension")


@pytest.mark.parametrize("heartbeat", [-1, "0.5s", "1s"])
def test_a_heartbeat_not_shorter_than_the_lease_is_still_rejected(heartbeat: str | int) -> None:
    with pytest.raises(replayq.ContractError, match="heartbeat"):
        build_contract("ship", fields=(), lease="0.5s", heartbeat=heartbeat)
