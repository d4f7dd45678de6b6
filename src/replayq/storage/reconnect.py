"""Riding out a database outage: capped, jittered exponential backoff, each retry logged.

Workers, heartbeats, settles and ``ctx.effect`` bookkeeping retry
``DatabaseUnavailableError`` (refused connection, killed session, server restart,
pool timeout; on SQLite a lock held past ``busy_timeout``, disk full, a read-only
file system, an I/O error): the statement never ran or its outcome is unknown, and
every write replayq retries is a compare-and-set, so running it again is safe.

An outage is logged once, as a warning naming its cause, when it starts (and again
only if the cause changes), and once when it ends; the retries between are debug
records, so a 30-second outage is two lines per worker loop, not a hundred. Other
``StorageError``s are raised at once, except by a job's settle, which tries a few
times (e.g. SQLite's write lock held past ``busy_timeout``) before leaving the job
to the reaper.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from replayq.errors import DatabaseUnavailableError, StorageClosedError

T = TypeVar("T")

log = logging.getLogger("replayq.reconnect")

FIRST_DELAY = 0.05
MAX_DELAY = 2.0


def cause_of(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name if it has none): the cause
    an outage is logged and traced under."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Backoff:
    """Delays of ``first · 2ⁿ`` capped at ``cap``, jittered; ``reset()`` after a success."""

    def __init__(
        self,
        what: str,
        *,
        first: float = FIRST_DELAY,
        cap: float = MAX_DELAY,
        fault: str = "database unavailable",
    ) -> None:
        self.what = what
        self.first = first
        self.cap = cap
        # What the failures are, for the log (a worker's start errors: not the database).
        self.fault = fault
        self.failures = 0
        self._cause: str | None = None

    def reset(self) -> None:
        if self.failures:
            log.info("%s: database reachable again after %d failed tries", self.what, self.failures)
        self.failures = 0
        self._cause = None

    def failed(self, exc: BaseException) -> bool:
        """Count one failure: ``True`` when it starts the outage or changes its cause, for
        a caller that logs the outage in words of its own (``next_delay`` logs it here)."""
        self.failures += 1
        cause = cause_of(exc)
        if cause == self._cause:
            return False
        self._cause = cause
        return True

    def next_delay(self, exc: BaseException) -> float:
        """Count one failure, log it, and return how long to wait before the next try."""
        # The exponent is bounded: 2**1024 is no float, and an outage may last hours.
        ceiling = min(self.cap, self.first * 2 ** min(self.failures, 60))
        # Jitter keeps a fleet of workers from reconnecting in lock step after a restart.
        delay = random.uniform(ceiling / 2, ceiling)
        if self.failed(exc):
            log.warning(
                "%s: %s (%s); retrying with backoff (at most %.0fs apart) until it is back",
                self.what,
                self.fault,
                self._cause,
                self.cap,
            )
        else:
            log.debug("%s: still unavailable; retry %d in %.2fs", self.what, self.failures, delay)
        return delay

    def wait(self, exc: BaseException, stop: threading.Event) -> bool:
        """Sleep the next delay; ``False`` (at once) when ``stop`` is set: give up."""
        if stop.is_set():
            return False
        return not stop.wait(self.next_delay(exc))


# Tries in a row that met a closed storage before ``retry_unavailable`` raises it.
CLOSED_TRIES = 3


def retry_unavailable(what: str, attempt: Callable[[bool], T], *, seconds: float) -> T:
    """Call ``attempt(retrying)`` until it gets through to the database.

    ``retrying`` is ``False`` on the first call. A ``DatabaseUnavailableError`` is
    retried with backoff for up to ``seconds``, then raised. So is a
    ``StorageClosedError`` (nothing of that try committed), at most
    ``CLOSED_TRIES`` times in a row: an ``App`` closed meanwhile (``App.close()`` while
    its worker runs) opens a new storage at the next try's ``runtime.storage``; a storage
    closed for good raises it again at once, and it is raised.
    """
    give_up = time.monotonic() + seconds
    retrying = False
    closed = 0
    backoff = None  # made at the first failure: most calls get through at once
    while True:
        try:
            return attempt(retrying)
        except (DatabaseUnavailableError, StorageClosedError) as exc:
            closed = closed + 1 if isinstance(exc, StorageClosedError) else 0
            if time.monotonic() > give_up or closed >= CLOSED_TRIES:
                raise
            retrying = True
            if backoff is None:
                backoff = Backoff(what)
            time.sleep(backoff.next_delay(exc))
