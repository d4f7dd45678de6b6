"""An observer that writes down what a worker told it about each job (tests only)."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import AbstractContextManager, nullcontext

import replayq


class Ledger(replayq.Observer):
    """What one worker told its observers about each job: attempts begun, ``settled``
    and ``released`` (with the reasons, in order); safe across the worker's threads."""

    def __init__(self) -> None:
        self.attempts: Counter[int] = Counter()
        self.settled_ids: Counter[int] = Counter()
        self.released_ids: dict[int, list[str]] = {}
        self.lock = threading.Lock()

    def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
        with self.lock:
            self.attempts[job.id] += 1
        return nullcontext()

    def settled(self, job: replayq.Job) -> None:
        with self.lock:
            self.settled_ids[job.id] += 1

    def released(self, job: replayq.Job, reason: replayq.ReleaseReason) -> None:
        with self.lock:
            self.released_ids.setdefault(job.id, []).append(str(reason))
