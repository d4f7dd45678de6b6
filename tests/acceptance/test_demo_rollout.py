"""``replayq demo rollout`` runs within a minute and shows each act's evidence."""

from __future__ import annotations

import io

import pytest

from replayq.demo.rollout import run_rollout_demo


@pytest.mark.timeout(120)
def test_the_rollout_demo_catches_v2_holds_the_ramp_rolls_back_then_finishes_v3() -> None:
    out = io.StringIO()
    result = run_rollout_demo(out)
    text = out.getvalue()
    assert result.verify_counts == {"retry_decision": 20}
    assert "ramp to 100% refused: retry rate: v2" in result.ramp_refusal
    assert result.leased_on_v2_after_rollback == 0
    assert result.v3_verify_counts == {} and result.v3_verified == 100
    assert result.baseline_after_finish == "v3"
    assert result.seconds < 60
    assert "recorded 'dead: not_retryable', v2 'retry in" in text
    assert "every gate passed: v3 is the baseline and the only route" in text
