"""Which slots of a cron schedule are due, and what each missed-slot policy enqueues."""

from __future__ import annotations

import pytest

from replayq import ConfigurationError, MissedSlots, Schedule
from replayq.queue.schedule import decide_slots, slot_message_id

MINUTE = 1_700_000_040.0  # a whole minute (…:54:00 UTC)


def every_minute(missed: MissedSlots, catch_up: int = 100) -> Schedule:
    return Schedule("report", "* * * * *", "report", missed=missed, catch_up=catch_up)


@pytest.mark.parametrize("policy", list(MissedSlots))
def test_an_on_time_slot_is_enqueued_under_every_policy(policy: MissedSlots) -> None:
    decision = decide_slots(every_minute(policy), anchor=MINUTE - 30, now=MINUTE + 2)
    assert decision.enqueue == (MINUTE,)
    assert decision.anchor == MINUTE
    assert decision.skipped == 0


def test_nothing_is_due_before_the_next_slot() -> None:
    decision = decide_slots(every_minute(MissedSlots.RUN_ALL), anchor=MINUTE, now=MINUTE + 59)
    assert decision.enqueue == ()
    assert decision.anchor is None


def test_skip_drops_missed_slots_and_keeps_the_on_time_one() -> None:
    # Down from MINUTE until 30 s past the 10th minute: +1..+9 were missed, +10 is on time.
    decision = decide_slots(every_minute(MissedSlots.SKIP), anchor=MINUTE, now=MINUTE + 630)
    assert decision.enqueue == (MINUTE + 600,)
    assert decision.anchor == MINUTE + 600
    assert decision.skipped == 9


def test_skip_enqueues_nothing_when_even_the_newest_slot_is_late() -> None:
    schedule = Schedule("report", "* * * * *", "report", grace_seconds=10)
    decision = decide_slots(schedule, anchor=MINUTE, now=MINUTE + 630)
    assert decision.enqueue == ()
    assert decision.anchor == MINUTE + 600
    assert decision.skipped == 10


def test_run_once_enqueues_one_job_for_all_missed_slots() -> None:
    schedule = Schedule(
        "report", "* * * * *", "report", missed=MissedSlots.RUN_ONCE, grace_seconds=10
    )
    decision = decide_slots(schedule, anchor=MINUTE, now=MINUTE + 630)
    assert decision.enqueue == (MINUTE + 600,)
    assert decision.skipped == 9


def test_run_all_enqueues_the_newest_missed_slots_up_to_its_bound() -> None:
    decision = decide_slots(
        every_minute(MissedSlots.RUN_ALL, catch_up=4), anchor=MINUTE, now=MINUTE + 630
    )
    # The on-time slot, and the 4 newest of the 9 missed.
    assert decision.enqueue == tuple(MINUTE + 60 * k for k in (6, 7, 8, 9, 10))
    assert decision.skipped == 5


def test_a_slot_has_one_message_id_whatever_the_timezone() -> None:
    assert slot_message_id("report", MINUTE) == "schedule:report:2023-11-14T22:14:00Z"


def test_a_bad_cron_line_or_timezone_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match="cron"):
        Schedule("r", "every minute", "report")
    with pytest.raises(ConfigurationError, match="timezone"):
        Schedule("r", "* * * * *", "report", timezone="Mars/Olympus")
