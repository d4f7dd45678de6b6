"""Declaring periodic jobs: the body of ``App.periodic``, checked and added to the registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from replayq.durations import Duration
from replayq.errors import ConfigurationError, ContractError
from replayq.queue.handlers import HandlerRegistry
from replayq.queue.schedule import MissedSlots, Schedule, parse_grace

__all__ = ["periodic_decorator"]

F = TypeVar("F", bound=Callable[..., Any])


def periodic_decorator(
    registry: HandlerRegistry,
    cron: str,
    *,
    job: str | None,
    payload: Mapping[str, Any] | None,
    name: str | None,
    timezone: str,
    missed: str,
    catch_up: int,
    grace: Duration | None,
    queue: str | None,
    priority: int,
) -> Callable[[F], F]:
    """``App.periodic``: declare the schedule now (``job=``) or on the decorated handler's type."""
    try:
        policy = MissedSlots(missed)
    except ValueError:
        raise ConfigurationError(
            f"missed={missed!r}: use one of {', '.join(m.value for m in MissedSlots)}"
        ) from None

    def declare(job_type: str) -> None:
        schedule = Schedule(
            name=name or job_type,
            cron=cron,
            job_type=job_type,
            payload=dict(payload or {}),
            timezone=timezone,
            missed=policy,
            catch_up=catch_up,
            grace_seconds=parse_grace(grace),
            queue=queue,
            priority=priority,
        )
        if any(s.name == schedule.name for s in registry.schedules):
            raise ConfigurationError(f"a schedule named {schedule.name!r} is declared twice")
        registry.schedules.append(schedule)

    if job is not None:
        declare(job)

    def decorate(fn: F) -> F:
        if job is None:
            found = [h.contract.name for h in registry.handlers() if h.fn is fn]
            if not found:
                raise ContractError(
                    "@app.periodic without job= goes above @app.job(...) on the handler"
                )
            declare(found[0])
        return fn

    return decorate
