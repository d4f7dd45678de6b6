"""The scheduler: enqueues each due slot of an app's schedules exactly once.

However many schedulers run (every worker runs one by default), a slot is decided
by the one whose compare-and-set moves the schedule's anchor, in the transaction
that enqueues the slot's job (``schedule.py`` says which slots are due).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from replayq.errors import ConfigurationError, UnknownJobTypeError
from replayq.queue.enqueue import EnqueueRequest, insert_job
from replayq.queue.schedule import Schedule, cron_slots, decide_slots, slot_message_id
from replayq.runtime import Runtime
from replayq.storage.protocol import ScheduleAdvance, ScheduleMade, ScheduleRegister

__all__ = ["ScheduleStatus", "Scheduler", "schedule_statuses"]

log = logging.getLogger("replayq.scheduler")


@dataclass(frozen=True)
class ScheduleStatus:
    """A schedule as stored: the last slot it enqueued, the job that made, the next slot."""

    name: str
    cron: str
    job_type: str
    timezone: str
    missed: str
    last_slot: float | None
    last_job_id: int | None
    next_slot: float | None
    declared: bool


class Scheduler:
    """Enqueues the due slots of an app's schedules; run by the worker's dispatcher.

    ``tick()`` is cheap when nothing is due (no query): it remembers when each
    schedule's next slot comes and looks at the database only then.
    """

    def __init__(self, runtime: Runtime, schedules: Sequence[Schedule]) -> None:
        self.runtime = runtime
        self.schedules = list(schedules)
        for schedule in self.schedules:
            if not runtime.registry.declares(schedule.job_type):
                raise UnknownJobTypeError(
                    f"schedule {schedule.name!r} enqueues {schedule.job_type!r}, "
                    "which this app does not declare"
                )
            # A payload the handler would refuse fails at start, not at every slot.
            runtime.registry.handler(schedule.job_type).encode_payload(dict(schedule.payload))
        self._due_at: dict[str, float] = {}
        self.enqueued = 0

    def register(self) -> None:
        """Store each schedule's declaration; one seen for the first time is anchored now."""
        now = self.runtime.clock.now()
        with self.runtime.storage.transaction() as tx:
            for schedule in self.schedules:
                tx.schedule_update(
                    ScheduleRegister(
                        name=schedule.name,
                        cron=schedule.cron,
                        job_type=schedule.job_type,
                        timezone=schedule.timezone,
                        missed=str(schedule.missed),
                        next_slot=schedule.next_slot(now),
                        now=now,
                    )
                )

    def tick(self) -> float | None:
        """Enqueue every due slot; returns when the next slot of any schedule is due."""
        now = self.runtime.clock.now()
        for schedule in self.schedules:
            if self._due_at.get(schedule.name, 0.0) <= now:
                self._due_at[schedule.name] = self._decide(schedule, now)
        return min(self._due_at.values(), default=None)

    def _decide(self, schedule: Schedule, now: float) -> float:
        with self.runtime.storage.transaction() as tx:
            found = tx.schedule_list(schedule.name)
            row = found[0] if found else None
            if row is None:
                raise ConfigurationError(f"schedule {schedule.name!r} is not registered")
            decision = decide_slots(schedule, float(row.anchor), now)
            next_slot = schedule.next_slot(now)
            if decision.anchor is None:
                return next_slot
            moved = tx.schedule_update(
                ScheduleAdvance(
                    name=schedule.name,
                    expected_anchor=row.anchor,
                    anchor=decision.anchor,
                    next_slot=next_slot,
                    now=now,
                )
            )
            if not moved:
                return next_slot  # another scheduler decided these slots
            for slot in decision.enqueue:
                request = EnqueueRequest(
                    schedule.job_type,
                    dict(schedule.payload),
                    message_id=slot_message_id(schedule.name, slot),
                    run_at=slot,
                    priority=schedule.priority,
                )
                job_id = insert_job(
                    self.runtime,
                    tx,
                    request,
                    queue=schedule.queue,
                    causation_id=f"schedule:{schedule.name}",
                )
                tx.schedule_update(ScheduleMade(schedule.name, slot, job_id))
        self.enqueued += len(decision.enqueue)
        if decision.skipped:
            log.warning(
                "schedule %s: %d missed slot(s) skipped (policy %s)",
                schedule.name,
                decision.skipped,
                schedule.missed,
            )
        return next_slot


def schedule_statuses(runtime: Runtime, declared: Sequence[Schedule]) -> list[ScheduleStatus]:
    """Every stored schedule, and each declared one not yet stored by a worker."""
    with runtime.storage.transaction(readonly=True) as tx:
        rows = {row.name: row for row in tx.schedule_list()}
    names = {s.name for s in declared}
    now = runtime.clock.now()

    def next_slot(cron: str, timezone: str) -> float:
        return float(cron_slots(cron, timezone, now).get_next(float))

    statuses = [
        ScheduleStatus(
            name=row.name,
            cron=row.cron,
            job_type=row.job_type,
            timezone=row.timezone,
            missed=row.missed,
            last_slot=row.last_slot,
            last_job_id=row.last_job_id,
            next_slot=next_slot(row.cron, row.timezone),
            declared=row.name in names,
        )
        for row in rows.values()
    ]
    statuses += [
        ScheduleStatus(
            s.name,
            s.cron,
            s.job_type,
            s.timezone,
            str(s.missed),
            None,
            None,
            s.next_slot(now),
            True,
        )
        for s in declared
        if s.name not in rows
    ]
    return sorted(statuses, key=lambda s: s.name)
