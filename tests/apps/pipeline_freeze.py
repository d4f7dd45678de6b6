"""A job whose worker can stop itself inside a pipelined commit, before its ``Sync``.

``pack`` runs one ``ctx.effect`` (``tests/apps/storage_faults.py``'s sink and counting
server), then, in the same step, writes the entity ``parcel/{n}`` (``ctx.state.put``):
the step's commit is one pipelined transaction (``commit_at_once``), its fenced trace
append holding the job row ``FOR SHARE``.

With ``$PIPELINE_FREEZE_JOB`` set, the process wraps ``replayq.storage.postgres``'s
``_queue_command`` (how ``PostgresTransaction.pipelined`` queues ``COMMIT`` after the
block's statements went out): in the first step commit of job ``n ==
$PIPELINE_FREEZE_JOB``, once ``COMMIT`` is queued (the statements sent and flushed;
``COMMIT`` and the ``Sync`` still in psycopg's queue), it writes its session's backend
pid to ``$PIPELINE_FREEZE_MARK`` and SIGSTOPs itself: the whole worker frozen inside the
window ``docs/postgres.md`` describes, until the test sends SIGCONT or SIGKILL.

The hook lives here, as the other fault points of ``tests/apps`` do, not in ``src/``:
unset, nothing is wrapped, and a worker pays nothing for it, not even a test of a flag
per commit. Should ``pipelined`` stop queuing ``COMMIT`` through ``_queue_command``, the
worker never stops and the test fails waiting for the mark; should it stop before the
statements reach the server, the test fails on its premise (the session's state).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import replayq
from replayq.storage import postgres
from tests.apps.storage_faults import _deliver

FREEZE_JOB = os.environ.get("PIPELINE_FREEZE_JOB")
# The executor thread whose next queued COMMIT freezes the process (armed by ``pack``),
# once per process.
_armed = threading.local()
_frozen_once = threading.Event()
_queue_command = postgres._queue_command


def _queue_then_freeze(conn: Any, command: bytes) -> None:
    """``_queue_command``; then, for the armed thread's ``COMMIT``, the freeze."""
    _queue_command(conn, command)
    if command != b"COMMIT" or not getattr(_armed, "on", False):
        return
    _armed.on = False
    mark = Path(os.environ["PIPELINE_FREEZE_MARK"])
    mark.with_suffix(".tmp").write_text(json.dumps({"backend_pid": conn.info.backend_pid}))
    mark.with_suffix(".tmp").rename(mark)
    # Directed at this thread: it stops before pthread_kill returns, then the others. A
    # SIGSTOP to the process goes to its main thread, and this one could run on and send
    # COMMIT before the stop reached it (seen once in seven runs on a loaded machine).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


if FREEZE_JOB is not None:
    postgres._queue_command = _queue_then_freeze


def pack(ctx: replayq.Context, n: int, sink: str) -> dict[str, int]:
    with ctx.step("pack"):
        ctx.effect("parcel.deliver", lambda: _deliver(sink, n))
        ctx.state.put("parcel", str(n), {"n": n})
        if str(n) == FREEZE_JOB and not _frozen_once.is_set():
            _frozen_once.set()
            _armed.on = True  # this step's commit, the next COMMIT this thread queues
    return {"n": n}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    built.job(
        "pack",
        idempotency="pack:{n}",
        lease="2s",
        heartbeat="0.5s",
        retry=replayq.Retry(max_attempts=3, base="0.05s", cap="0.2s"),
    )(pack)
    return built


app = build()
