"""A live fork or rerun holds the job it runs from, so gc leaves that job alone meanwhile.

gc trims a finished job past its full tier to its ledger and deletes its derived traces
past their days; a fork that is running reads the job's recording and writes its own
derived trace for as long as it runs (a rerun appends to the job's trace). ``held``
records a hold (``rq_gc_holds``) before the recording is loaded and releases it at the
end: gc skips a held job and the derived traces of it. A holder that dies leaves its hold
to expire after ``HOLD_SECONDS``.

A dry-run needs no hold: it reads the recording in one snapshot and writes its derived
trace in one transaction at its end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from replayq.runtime import Runtime
from replayq.storage.retention_params import KeepHold, KeepRelease

# How long a hold outlives a holder that died without releasing it.
HOLD_SECONDS = 86_400.0


@contextmanager
def held(runtime: Runtime, job_id: int, what: str) -> Iterator[str]:
    """Hold ``job_id`` against gc while the block runs; yields the holder's name."""
    holder = f"{what}-{uuid.uuid4().hex[:16]}"
    with runtime.storage.transaction() as tx:
        tx.keep_transition(KeepHold(holder, job_id, runtime.clock.now() + HOLD_SECONDS))
    try:
        yield holder
    finally:
        with runtime.storage.transaction() as tx:
            tx.keep_transition(KeepRelease(holder))
