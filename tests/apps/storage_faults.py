"""A job with a recorded call and an effect, for storage-fault tests (locks, disk full).

``deliver`` asks a recorded ``ctx.call`` for a quote, writes the parcel's state in a
step of its own (a step commit that can meet the fault), then runs one ``ctx.effect``
under the business key ``deliver:{n}``. The effect appends a line to ``sink``: the ground
truth of how often the effect really ran, with the ``POST /effects/<n>`` it first
sends to the counting HTTP server of ``tests/services.py`` when
``$REPLAYQ_TEST_SERVICE`` names one. The lease (30 s) outlasts the faults the
tests hold, so a worker that cannot heartbeat through an outage keeps its jobs.

``$CHAOS_CLOCK_OFFSET`` (seconds, e.g. ``30`` or ``-30``) shifts the clock of the
process that imports ``app``: a worker whose wall clock is that far off. It is a
``SystemClock`` (a real wall clock, a wrong one), so, as on a host whose clock has
drifted, the database's clock still judges its leases; only its own reads of "now"
(``run_at``, retries, trace timestamps, ``ctx.now``) are off.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import replayq
from tests.apps.counting import count_effect
from tests.apps.sleepy import record


class OffsetClock(replayq.SystemClock):
    """The system clock shifted by ``offset`` seconds (a skewed host)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


def _deliver(sink: str, n: int) -> None:
    count_effect(str(n))  # the counting HTTP server, when the test runs one
    record(sink, "effect", n)


HELD_JOB = 10


def hold_inside_step(directory: Path) -> tuple[Path, dict[str, str]]:
    """(the hold file, the workers' environment) for a test that holds job ``HELD_JOB``
    inside its step: delete the file once the fault is on, and that step's commit meets
    the fault for certain."""
    hold = directory / "hold"
    hold.touch()
    return hold, {"STORAGE_FAULTS_HOLD": str(hold), "STORAGE_FAULTS_HOLD_JOB": str(HELD_JOB)}


def inside(hold: Path) -> bool:
    """Whether the held job has reached its hold (its handler runs, inside its step): a
    job ``running`` in the database may only be leased ahead, its handler not started."""
    return hold.with_name(hold.name + ".inside").exists()


def _held_here(n: int) -> None:
    """Job ``$STORAGE_FAULTS_HOLD_JOB`` waits inside its step, before the step commits,
    while the file ``$STORAGE_FAULTS_HOLD`` exists: a test brings the fault on meanwhile,
    so that commit meets it for certain. It says it got there (``inside``)."""
    hold = os.environ.get("STORAGE_FAULTS_HOLD")
    if hold and str(n) == os.environ.get("STORAGE_FAULTS_HOLD_JOB"):
        Path(hold + ".inside").touch()
        while os.path.exists(hold):
            time.sleep(0.02)


def deliver(ctx: replayq.Context, n: int, sink: str) -> dict[str, int]:
    quote: int = ctx.call("quote", lambda: n * 2)
    with ctx.step("pack"):
        # A step whose commit meets the fault (not only an effect's bookkeeping, which
        # waits an outage out on its own).
        ctx.state.put("parcel", str(n), {"quote": quote})
        _held_here(n)
    with ctx.step("deliver"):
        ctx.effect("parcel.deliver", lambda: _deliver(sink, n))
    return {"n": n, "quote": quote}


def build(url: str | None = None, offset: float = 0.0) -> replayq.App:
    built = replayq.App(url, clock=OffsetClock(offset) if offset else None)
    built.job(
        "deliver",
        idempotency="deliver:{n}",
        lease="30s",
        heartbeat="2s",
        retry=replayq.Retry(max_attempts=3, base="0.05s", cap="0.2s"),
    )(deliver)
    return built


app = build(offset=float(os.environ.get("CHAOS_CLOCK_OFFSET", "0")))
