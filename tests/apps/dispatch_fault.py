"""The ``tests.apps.sleepy`` jobs on a clock that fails once on the worker's main thread.

A ``replayq worker`` runs its dispatcher (lease, reap, periodic jobs) on its main thread.
Once the file named by ``$DISPATCH_FAULT`` exists, the next reading of the clock there
deletes it and raises ``RuntimeError``: the dispatcher dies of an error that is not the
database's (a clock source erring, as an app's own clock may). The clock is a
``SystemClock`` (a real wall clock), so leases are judged by the database and the
executors' starts never read it.
"""

from __future__ import annotations

import os
import threading
import time

import replayq
from tests.apps import sleepy


class FailingOnceOnMain(replayq.SystemClock):
    """The system clock; its next reading on the main thread fails once the file
    ``$DISPATCH_FAULT`` exists (the reading deletes it: it fails once)."""

    def now(self) -> float:
        trigger = os.environ.get("DISPATCH_FAULT")
        if trigger and threading.current_thread() is threading.main_thread():
            try:
                os.unlink(trigger)
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError("the clock source failed")
        return time.time()


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url, clock=FailingOnceOnMain())
    built.job("sleep", retry=sleepy.QUICK_RETRY, **sleepy.SHORT_LEASE)(sleepy.sleep)
    return built


app = build()
