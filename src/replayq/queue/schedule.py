"""Periodic jobs: cron schedules and which of their slots are due (no I/O here).

``scheduler.py`` enqueues the slots. A schedule's row (``rq_schedules``) holds
its *anchor*: the newest slot already decided, enqueued or skipped. A scheduler
that finds slots due after the anchor moves it with a compare-and-set in the
transaction that enqueues them, so however many schedulers run (every worker
runs one by default), each slot is decided by one of them; the slot's job also
carries the message id ``schedule:NAME:SLOT``, which the queue deduplicates,
should a row ever be reset.

Missed slots (the scheduler was down, or the database was) follow the declared
policy. A slot is *on time* while it is the newest due slot and younger than
``min(grace, the schedule's period)``; the others are *missed*:

====================  ===================================================================
``skip``              missed slots are dropped; only an on-time slot is enqueued
``run_once``          one job for all of them: the on-time slot, else the newest missed one
``run_all``           every missed slot is enqueued, the newest ``catch_up`` of them at most
====================  ===================================================================

Limits: cron slots are whole seconds (a sixth field gives seconds); ``now`` is
the app's ``Clock``, so slots follow that clock, not the database's.

``croniter`` (and ``dateutil`` under it) is imported by ``cron_slots`` and the
validation, not by the module: every app and worker imports this one, most declare
no schedule.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from msgspec import Struct

from replayq.durations import Duration, parse_duration
from replayq.errors import ConfigurationError

__all__ = [
    "MissedSlots",
    "Schedule",
    "SlotDecision",
    "cron_slots",
    "decide_slots",
    "slot_message_id",
]

DEFAULT_GRACE_SECONDS = 60.0
DEFAULT_CATCH_UP = 100


class MissedSlots(enum.StrEnum):
    """What a scheduler does with slots that passed while no scheduler ran."""

    SKIP = "skip"
    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"


def cron_slots(cron: str, timezone: str, at: float) -> Any:
    """A ``croniter`` over ``cron``'s slots in ``timezone``, starting at ``at``."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    return croniter(cron, datetime.fromtimestamp(at, ZoneInfo(timezone)))


@dataclass(frozen=True)
class Schedule:
    """A periodic job as declared by ``App.periodic``; validated on construction."""

    name: str
    cron: str
    job_type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    missed: MissedSlots = MissedSlots.SKIP
    catch_up: int = DEFAULT_CATCH_UP
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    queue: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        # Imported here, as croniter: zoneinfo (8M instructions) is the schedules' alone.
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        from croniter import croniter

        if not croniter.is_valid(self.cron):
            raise ConfigurationError(f"schedule {self.name!r}: {self.cron!r} is not a cron line")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigurationError(
                f"schedule {self.name!r}: unknown timezone {self.timezone!r}"
            ) from exc
        if self.catch_up < 1:
            raise ConfigurationError(f"schedule {self.name!r}: catch_up must be at least 1")
        if self.grace_seconds <= 0:
            raise ConfigurationError(f"schedule {self.name!r}: grace must be positive")

    def next_slot(self, after: float) -> float:
        """The first slot strictly after ``after``."""
        return float(cron_slots(self.cron, self.timezone, after).get_next(float))

    def slots_back(self, now: float, above: float, limit: int) -> list[float]:
        """Up to ``limit`` slots in ``(above, now]``, newest first."""
        # Slots are whole seconds: start just past ``now`` so a slot at ``now`` counts.
        it = cron_slots(self.cron, self.timezone, now + 0.001)
        found: list[float] = []
        while len(found) < limit:
            slot = float(it.get_prev(float))
            if slot <= above:
                break
            found.append(slot)
        return found


class SlotDecision(Struct, frozen=True):
    """What one look at a schedule decided: the slots to enqueue, oldest first, and the
    new anchor (``None``: nothing was due)."""

    enqueue: tuple[float, ...]
    anchor: float | None
    skipped: int


def decide_slots(schedule: Schedule, anchor: float, now: float) -> SlotDecision:
    """The slots due in ``(anchor, now]`` and which of them the missed-slot policy enqueues."""
    limit = schedule.catch_up + 1 if schedule.missed is MissedSlots.RUN_ALL else 1
    due = schedule.slots_back(now, anchor, limit)
    if not due:
        return SlotDecision((), None, 0)
    newest = due[0]
    period = schedule.next_slot(newest) - newest
    on_time = now - newest < min(schedule.grace_seconds, period)
    # Only the newest due slot can be on time; below, count what lies behind it.
    behind = _count_due(schedule, anchor, newest)
    missed_total = behind + (0 if on_time else 1)
    if on_time:
        chosen = [newest]
        if schedule.missed is MissedSlots.RUN_ALL:
            chosen += due[1 : schedule.catch_up + 1]
    elif schedule.missed is MissedSlots.SKIP:
        chosen = []
    elif schedule.missed is MissedSlots.RUN_ONCE:
        chosen = [newest]
    else:
        chosen = due[: schedule.catch_up]
    skipped = missed_total - (len(chosen) - (1 if on_time else 0))
    return SlotDecision(tuple(sorted(chosen)), newest, skipped)


def _count_due(schedule: Schedule, anchor: float, before: float, cap: int = 1000) -> int:
    """How many slots lie in ``(anchor, before)``, counted up to ``cap`` (for the log):
    a long outage of a per-second schedule is not walked slot by slot."""
    return len(schedule.slots_back(before - 0.5, anchor, cap))


def slot_message_id(name: str, slot: float) -> str:
    """The message id of a slot's job: ``schedule:NAME:2026-11-30T18:05:00Z``."""
    return f"schedule:{name}:{datetime.fromtimestamp(slot, UTC):%Y-%m-%dT%H:%M:%SZ}"


def parse_grace(grace: Duration | None) -> float:
    """Seconds from a declared grace (``"30s"``, ``5``); the default is 60 seconds."""
    return DEFAULT_GRACE_SECONDS if grace is None else parse_duration(grace, name="grace")
