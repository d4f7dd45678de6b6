"""A per-second periodic job on a clock that runs ``$PERIODIC_SPEED`` times faster than time.

Every process that imports this module computes the same virtual "now" from the
same ``$PERIODIC_EPOCH`` (real seconds since the epoch, set by the test), so two
worker processes agree on which slots are due while 30 one-second slots pass in a
few real seconds.
"""

from __future__ import annotations

import os
import time

import replayq


class FastClock:
    """``epoch + (time.time() - epoch) * speed``: real time, sped up, shared by processes."""

    def __init__(self, epoch: float, speed: float) -> None:
        self.epoch, self.speed = epoch, speed

    def now(self) -> float:
        return self.epoch + (time.time() - self.epoch) * self.speed


def tick(ctx: replayq.Context, label: str) -> str:
    return label


def build(url: str | None = None) -> replayq.App:
    epoch = float(os.environ.get("PERIODIC_EPOCH", time.time()))
    speed = float(os.environ.get("PERIODIC_SPEED", "1"))
    built = replayq.App(url, clock=FastClock(epoch, speed))
    built.periodic("* * * * * *", payload={"label": "every second"}, missed="run_all")(
        built.job("tick", lease="5s")(tick)
    )
    return built


app = build()
