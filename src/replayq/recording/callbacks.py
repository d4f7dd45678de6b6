"""The application's functions replayq runs inside its own commit, and the ``ctx`` calls
refused in them.

A ``ctx.db_write`` function runs inside the transaction that commits its step (or the
job's ack: ``recording.writes``). At a step's commit the context is in the middle of
its own recording: ``_live`` and ``_pending_lock`` are held (``StepBoundary.__exit__``,
``Recorder.commit_now``) and the pending record is being flushed. A ``ctx`` verb called
from there would wait for that commit forever (``ctx.step``, ``ctx.call``,
``ctx.effect`` take ``_live``, a plain lock: the worker's slot hung, its heartbeat
keeping the lease, and on SQLite the database's write lock held), or would record and
defer into a record already flushed (its write dropped while the trace said it
happened), or open a second transaction on the same connection. No replay or fork runs
the function, either, so nothing it records could be answered. So every verb and view
of the context refuses at once, in the thread that runs the function, with
``CallbackReentryError`` (class ``validation``): the commit rolls back and the attempt
fails saying which call and which function.

``running`` marks the context (``Context._callback``) for the function's run; each verb
and view entry point reads that one attribute (``refuse_inside`` is asked only when it is
set): other threads of the handler go on as before (they wait for the commit, as they
always did). A refusal the function caught and swallowed is raised again when it
returns: the commit never goes through with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from threading import get_ident
from typing import Any

from replayq.errors import CallbackReentryError
from replayq.recording.aio import close_unstarted


class Callback:
    """Which thread runs which of the attempt's callbacks, and what it refused."""

    __slots__ = ("refused", "thread", "what")

    def __init__(self, thread: int, what: str) -> None:
        self.thread = thread
        self.what = what
        self.refused: CallbackReentryError | None = None


@contextmanager
def running(ctx: Any, what: str) -> Iterator[None]:
    """``ctx``'s callback ``what`` (``ctx.db_write``) runs in this thread for the block.

    Raises the first refusal made in it once the block returns, if the function caught
    it (a refused verb never leaves the commit to go through)."""
    outer = ctx._callback
    mark = Callback(get_ident(), what)
    ctx._callback = mark
    try:
        yield
    finally:
        ctx._callback = outer
    if mark.refused is not None:
        raise mark.refused


def refuse_inside(ctx: Any, verb: str, fn: Any = None) -> None:
    """Raise ``CallbackReentryError`` if this thread runs one of ``ctx``'s callbacks (asked
    where ``ctx._callback`` is set); return in any other thread, which goes on as usual.
    ``fn``: what the verb was to call, a coroutine closed unawaited if refused."""
    mark: Callback | None = ctx._callback
    if mark is None or mark.thread != get_ident():
        return
    close_unstarted(fn)
    error = CallbackReentryError(
        f"{verb} inside a {mark.what} function: refused. replayq runs that function in the "
        "middle of its own commit (the transaction that commits its step, or the job's "
        "ack), where a ctx call would wait for that commit forever or record and write "
        "outside it, and no replay runs the function. Use only the connection it is "
        f"given: call {verb.partition('(')[0]} before {mark.what} and pass the function "
        "what it needs, or after the step. Nothing of the commit was written",
        verb=verb,
        callback=mark.what,
    )
    if mark.refused is None:
        mark.refused = error
    raise error
