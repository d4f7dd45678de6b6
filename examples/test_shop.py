"""The incident as a regression test: v2 must keep replaying the recorded case."""

from shop import app

import replayq.testing


def test_v2_replays_the_recorded_shipment() -> None:
    replayq.testing.assert_replays("case.json", app, version="v2")
