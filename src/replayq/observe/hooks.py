"""The worker's view of observers: told about attempts, and about committed events."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from enum import StrEnum

from replayq.model import Job, TraceEvent
from replayq.observe.logs import job_fields

log = logging.getLogger("replayq.observe")


class ReleaseReason(StrEnum):
    """Why a job the worker leased left it without an attempt (``Observer.released``)."""

    # The worker stopped (SIGTERM, ``Worker.stop``) while the job waited, leased ahead, or
    # its run ended (a burst's end, the grace over) before an executor started it: given
    # back to the queue unstarted (or, the database away, left to be reaped).
    STOPPED = "stopped"
    # Its lease was taken while it waited (the worker stalled past it and another worker
    # reaped it): dropped unrun, the heartbeat's ``lease.lost`` with ``started: false``.
    LOST = "lost"
    # It waited past its lease and was not renewed (the database away, the job asked to
    # stop, or a fixed visibility timeout, never renewed): dropped unrun, reaped later.
    NOT_RENEWED = "not_renewed"
    # Its start raised an unexpected error (a bug, the app's clock failing): given back to
    # the queue unstarted (or, the database away, left to be reaped), the error logged.
    ERROR = "error"


class Observer:
    """Base with no-op hooks; a metrics, tracing or logging observer overrides some.

    ``attempt`` wraps one attempt on the executor thread, from just before the
    handler runs until the worker has its outcome. ``settled(job)`` follows, once,
    when that outcome is committed (acked, retry scheduled, buried, rejected) or
    given up: on the executor thread right after ``attempt`` ends, or, for a success
    whose ack waits for a group commit (``worker/acks.py``), on the thread that
    commits the group, after its events went to ``events`` — possibly before
    ``attempt`` has ended. An observer ends its view of the attempt in ``settled``.
    ``job_seen`` names a job the worker handles without running it (leased, reaped), so its
    events can be labelled. ``released(job, reason)`` follows, once, for a job the worker
    leased (``job_seen``) and lets go of without an attempt, so with no ``attempt`` and no
    ``settled``: given back unstarted when the worker stops (or its start raised an
    unexpected error), or dropped unrun because its lease was lost or not renewed while it
    waited, leased ahead (``ReleaseReason``). Every leased job ends in exactly one of
    ``settled`` (after its attempt) and ``released``; an observer that keeps something per
    leased job forgets it in both. ``events`` receives the trace events of every committed
    transaction of the process, on the committing thread. An observer written before
    ``released`` existed (one not subclassing ``Observer`` that lacks it) still works: a
    hook it does not define is not called.
    """

    def attempt(self, job: Job, worker_id: str) -> AbstractContextManager[None]:
        return nullcontext()

    def settled(self, job: Job) -> None:
        return None

    def job_seen(self, job: Job) -> None:
        return None

    def released(self, job: Job, reason: ReleaseReason) -> None:
        return None

    def events(self, events: Sequence[TraceEvent]) -> None:
        return None


class Observers(Observer):
    """Several observers as one; every attempt also carries its log fields.

    An observer that raises is logged (with its traceback) and left out of that one call:
    the others are still told, and the worker goes on as if it had not raised — a
    metrics or tracing hook never fails, holds up or repeats a job, and never kills the
    thread that called it (an executor, the acks thread, the dispatcher). An exception the
    handler raised passes through every observer's ``attempt`` unchanged: an observer
    cannot swallow it."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.members = list(observers)

    def attempt(self, job: Job, worker_id: str) -> AbstractContextManager[None]:
        # With no observer (the default worker) only the log fields: no generator and
        # no ExitStack around every attempt.
        if not self.members:
            return job_fields(job, worker_id)
        return self._attempt_all(job, worker_id)

    @contextmanager
    def _attempt_all(self, job: Job, worker_id: str) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(job_fields(job, worker_id))
            for member in self.members:
                stack.enter_context(_guarded_attempt(member, job, worker_id))
            yield

    def settled(self, job: Job) -> None:
        for member in self.members:
            _call(member, "settled", job)

    def job_seen(self, job: Job) -> None:
        for member in self.members:
            _call(member, "job_seen", job)

    def settled_all(self, jobs: Sequence[Job]) -> None:
        """``settled`` for each of ``jobs`` in turn: one call for a worker's group, none
        per job when there is no observer (the default worker)."""
        if self.members:
            for job in jobs:
                self.settled(job)

    def job_seen_all(self, jobs: Sequence[Job]) -> None:
        """``job_seen`` for each of ``jobs`` in turn (a lease batch), as ``settled_all``."""
        if self.members:
            for job in jobs:
                self.job_seen(job)

    def released(self, job: Job, reason: ReleaseReason) -> None:
        self.released_all((job,), reason)

    def released_all(self, jobs: Sequence[Job], reason: ReleaseReason) -> None:
        """``released`` for each of ``jobs``, to each member that has the hook (one
        written before it existed may lack it)."""
        for member in self.members:
            if getattr(member, "released", None) is not None:
                for job in jobs:
                    _call(member, "released", job, reason)

    def events(self, events: Sequence[TraceEvent]) -> None:
        for member in self.members:
            _call(member, "events", events)


def _call(member: Observer, hook: str, *args: object) -> None:
    """``member.<hook>(*args)``; what it raises is logged, not passed on."""
    try:
        getattr(member, hook)(*args)
    except Exception:
        log.exception("observer %r raised in %s; the worker goes on", member, hook)


@contextmanager
def _guarded_attempt(member: Observer, job: Job, worker_id: str) -> Iterator[None]:
    """``member.attempt(job, worker_id)`` around the attempt; what its entry or its exit
    raises is logged, not passed on, and the attempt's own exception goes through as it
    is (an observer's exit returning true does not swallow it)."""
    try:
        context = member.attempt(job, worker_id)
        context.__enter__()
    except Exception:
        log.exception("observer %r raised entering the attempt of job %s", member, job.id)
        yield
        return
    try:
        yield
    except BaseException as exc:
        try:
            context.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as raised:
            if raised is not exc:
                log.exception("observer %r raised leaving the attempt of job %s", member, job.id)
        raise
    try:
        context.__exit__(None, None, None)
    except Exception:
        log.exception("observer %r raised leaving the attempt of job %s", member, job.id)
