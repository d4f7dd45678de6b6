"""A read made in one thread of the handler while another thread's step commits: it does
not wait for that commit (a read joins no write to the record the commit flushes; it is
ordered only with the attempt's end). A ``ctx.db_write`` function that waits for such a
thread (here, for a lock of the application's that the reading thread holds) finishes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import replayq
from replayq.testing import run_inline

AppFactory = Callable[..., replayq.App]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read", ["state", "cache", "cache set in a step"])
def test_a_read_does_not_wait_for_another_threads_step_commit(
    app_factory: AppFactory, read: str
) -> None:
    """Thread B holds the application's lock and reads through ``ctx`` (or caches a value
    inside a step of its own) once thread A's step commit is running its ``db_write``
    function, which takes that lock. The job succeeds and records B's read (before, B's
    read waited for ``_pending_lock``, which A's commit held while its function waited for
    B: the worker hung)."""
    app = app_factory()

    @app.job("two_threads")
    def two_threads(ctx: replayq.Context) -> None:
        app_lock = threading.Lock()
        in_commit = threading.Event()
        b_holds = threading.Event()

        def under_app_lock(conn: object) -> None:
            in_commit.set()
            with app_lock:  # the reading thread lets go once its read returns
                pass

        def a() -> None:
            b_holds.wait()
            with ctx.step("write"):
                ctx.db_write(under_app_lock)

        def read_under_app_lock() -> None:
            with app_lock:
                b_holds.set()
                in_commit.wait()
                if read == "state":
                    ctx.state.get("acct", "1")
                elif read == "cache":
                    ctx.cache.get("acct", 1)
                else:  # the entry waits for this step's own commit, after the lock
                    ctx.cache.set("acct", 1, {"v": 1}, version=1)

        def b() -> None:
            if read == "cache set in a step":
                with ctx.step("cache"):
                    read_under_app_lock()
            else:
                read_under_app_lock()

        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    job = run_inline(app, "two_threads", {})
    assert job.state is replayq.JobState.SUCCEEDED
    event = {"state": "state.read", "cache": "cache.read"}.get(read, "cache.write")
    assert sum(e.name == event for e in app.trace(job.id)) == 1
