"""The worker's one event loop: every ``async def`` handler of a worker runs on it.

An executor slot that leases an async job hands the handler's coroutine to this
loop (``run``) and waits for its outcome, so ``--concurrency N`` async jobs
await side by side on one loop in one thread, while leasing, heartbeats and
settling stay where they are for every job. The coroutine is scheduled with
``run_coroutine_threadsafe``, which copies the submitting thread's context
variables into the task: a sealed run stays sealed, ``unsealed()`` inside
``ctx.call``/``ctx.effect`` stays per task.

Known limit: ``ctx`` verbs that touch the database (a step's commit, an
effect's claim, a state read) are synchronous and run on the loop's thread,
blocking the other async jobs for as long as the query takes (about a
millisecond on SQLite, one round trip on PostgreSQL). A handler that blocks in
its own code (``time.sleep``, a synchronous HTTP client) blocks them all: use
``await asyncio.to_thread(...)`` for such calls.

``asyncio`` itself (with ``ssl``, ``socket``, ``subprocess`` under it) is imported
on the first async job, not by the module: a worker without async handlers never
needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio


class EventLoopThread:
    """One asyncio loop in a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _started(self) -> asyncio.AbstractEventLoop:
        import asyncio

        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._run_forever, args=(loop,), name=self._name, daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's thread: ``run_forever`` until ``close`` stops it.

        A task that raises ``KeyboardInterrupt`` or ``SystemExit`` (a handler's, or a
        ``ctx.db_write`` function's at a step's commit: no signal raises them here) has
        it set as its result, for its job's executor to fail the attempt with, and then
        raised out of ``run_forever`` too (``asyncio`` lets them through to stop the
        loop): the loop is run again, the other tasks' handles where they were. Before,
        the thread ended with it, and every async job after it waited for good."""
        while True:
            try:
                loop.run_forever()
                return
            except BaseException:
                if self._loop is not loop:
                    return  # being closed: no one waits for it any more

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (or its exception)."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self._started()).result()

    def close(self) -> None:
        """Stop the loop once its tasks are done (the worker drained its jobs first)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
