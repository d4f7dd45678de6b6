"""The one source of "now", and the hybrid logical clock that orders events across workers.

Every time-dependent query takes ``now`` from a ``Clock`` so that lease expiry,
retry scheduling and deterministic replay can be tested with a frozen clock.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds since the epoch, as a float."""

    def now(self) -> float: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()


class FrozenClock:
    """A clock that only moves when told to; for tests and replay."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        """Jump to ``when`` (seconds since the epoch)."""
        with self._lock:
            self._now = when


_LOGICAL_BITS = 16
_LOGICAL_MASK = (1 << _LOGICAL_BITS) - 1


class HybridLogicalClock:
    """Hybrid logical clock (physical milliseconds << 16 | logical counter).

    ``tick()`` stamps a local event; ``observe(remote)`` merges a value read
    from shared state (a job row, a lock, an entity), so that anything this
    process does afterwards orders after what it observed, whatever the wall
    clocks of the two hosts say.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # ``stamp``'s reading of ``clock``: the real clock's is ``time.time`` itself (one
        # Python call fewer for each recorded event).
        self._read = time.time if type(clock) is SystemClock else clock.now
        self._last = 0
        self._lock = threading.Lock()

    def tick(self) -> int:
        """The stamp of a local event: after every stamp and observation so far."""
        return self.tick_at(self._clock.now())

    def tick_at(self, now: float) -> int:
        """``tick`` at ``now``, a reading of this clock's own ``Clock`` that the caller
        made anyway (an event's ``ts``): one clock read per event, not two."""
        physical = int(now * 1000) << _LOGICAL_BITS
        # ``acquire``/``release``, not ``with``: nothing between them can raise, and the
        # ``with`` block's ``__enter__`` and ``__exit__`` calls cost ~1 K instructions more.
        lock = self._lock
        lock.acquire()
        last = self._last
        self._last = last = physical if physical > last else last + 1
        lock.release()
        return last

    def stamp(self) -> tuple[float, int]:
        """A local event's reading of this clock's ``Clock`` and its stamp: ``tick_at`` of
        that reading, in one call (each event of a traced job is stamped)."""
        now = self._read()
        physical = int(now * 1000) << _LOGICAL_BITS
        lock = self._lock  # as in ``tick_at``
        lock.acquire()
        last = self._last
        self._last = last = physical if physical > last else last + 1
        lock.release()
        return now, last

    def observe(self, remote: int | None) -> None:
        if remote is None:
            return
        with self._lock:
            if remote > self._last:
                self._last = remote

    @staticmethod
    def physical_ms(value: int) -> int:
        """The wall-clock milliseconds part of an HLC value."""
        return value >> _LOGICAL_BITS

    @staticmethod
    def logical(value: int) -> int:
        """The logical counter part of an HLC value."""
        return value & _LOGICAL_MASK
