"""The worker's view of observers: told about attempts, and about committed events."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from replayq.model import Job, TraceEvent
from replayq.observe.logs import job_fields


class Observer:
    """Base with no-op hooks; a metrics, tracing or logging observer overrides some.

    ``attempt`` wraps one attempt on the executor thread, from just before the
    handler runs until the attempt settled (acked, retry scheduled, buried or
    rejected). ``job_seen`` names a job the worker handles without running it
    (leased, reaped), so its events can be labelled. ``events`` receives the trace
    events of every committed transaction of the process, on the committing thread.
    """

    @contextmanager
    def attempt(self, job: Job, worker_id: str) -> Iterator[None]:
        yield

    def job_seen(self, job: Job) -> None:
        return None

    def events(self, events: Sequence[TraceEvent]) -> None:
        return None


class Observers(Observer):
    """Several observers as one; every attempt also carries its log fields."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.members = list(observers)

    @contextmanager
    def attempt(self, job: Job, worker_id: str) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(job_fields(job, worker_id))
            for member in self.members:
                stack.enter_context(member.attempt(job, worker_id))
            yield

    def job_seen(self, job: Job) -> None:
        for member in self.members:
            member.job_seen(job)

    def events(self, events: Sequence[TraceEvent]) -> None:
        for member in self.members:
            member.events(events)
