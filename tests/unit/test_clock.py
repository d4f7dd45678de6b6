"""The frozen clock and the hybrid logical clock that orders events across workers."""

from __future__ import annotations

import replayq


def test_frozen_clock_moves_only_when_told() -> None:
    clock = replayq.FrozenClock(100.0)
    assert clock.now() == clock.now() == 100.0
    clock.advance(2.5)
    assert clock.now() == 102.5
    clock.set(10.0)
    assert clock.now() == 10.0


def test_hlc_ticks_strictly_increase_while_wall_time_stands_still() -> None:
    hlc = replayq.HybridLogicalClock(replayq.FrozenClock(100.0))
    ticks = [hlc.tick() for _ in range(5)]
    assert ticks == sorted(set(ticks))
    assert {replayq.HybridLogicalClock.physical_ms(t) for t in ticks} == {100_000}
    assert [replayq.HybridLogicalClock.logical(t) for t in ticks] == [0, 1, 2, 3, 4]


def test_hlc_orders_after_what_it_observed_from_a_clock_that_runs_ahead() -> None:
    behind = replayq.HybridLogicalClock(replayq.FrozenClock(100.0))
    ahead = replayq.HybridLogicalClock(replayq.FrozenClock(500.0))
    remote = ahead.tick()
    behind.observe(remote)
    assert behind.tick() > remote


def test_hlc_follows_wall_time_when_it_moves_forward() -> None:
    clock = replayq.FrozenClock(100.0)
    hlc = replayq.HybridLogicalClock(clock)
    hlc.tick()
    clock.advance(1)
    assert replayq.HybridLogicalClock.physical_ms(hlc.tick()) == 101_000


def test_hlc_stamp_is_the_clock_reading_and_a_tick_in_one_order_with_ticks() -> None:
    clock = replayq.FrozenClock(100.0)
    hlc = replayq.HybridLogicalClock(clock)
    first = hlc.tick()
    now, stamped = hlc.stamp()
    assert now == 100.0
    assert first < stamped < hlc.tick()
    clock.advance(1)
    now, stamped = hlc.stamp()
    assert now == 101.0
    assert replayq.HybridLogicalClock.physical_ms(stamped) == 101_000
    hlc.observe(stamped + 10)
    assert hlc.stamp()[1] > stamped + 10


def test_hlc_stamp_on_the_system_clock_reads_wall_time() -> None:
    import time

    hlc = replayq.HybridLogicalClock(replayq.SystemClock())
    before = time.time()
    now, stamped = hlc.stamp()
    assert before <= now <= time.time()
    assert replayq.HybridLogicalClock.physical_ms(stamped) == int(now * 1000)
