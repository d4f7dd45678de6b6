"""Helpers for the recording-context tests (``tests/*/test_context_*.py``).

``run_once`` drives a worker in-process, one job at a time. ``count_rows``
reads the database itself (not replayq's API) so that a test can check what
was really stored: how many blob rows, outbox rows or idempotency records exist.
The profile jobs at the end are shared by the database-cache conformance test
and the Redis integration test, so both backends face the same scenario.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import replayq
from replayq.model import TraceEvent
from replayq.storage import packs


def run_once(worker: replayq.Worker) -> replayq.Job:
    """Lease exactly one job and run it to a settled state."""
    leased = worker.lease(1)
    assert len(leased) == 1, f"expected one job to be ready, leased {leased}"
    worker.execute(leased[0])
    return leased[0]


def named(app: replayq.App, job_id: int, name: str) -> list[TraceEvent]:
    """The job's events called ``name``, in HLC order."""
    return [event for event in app.trace(job_id) if event.name == name]


def names(app: replayq.App, job_id: int, *, kind: str | None = None) -> list[str]:
    return [e.name for e in app.trace(job_id) if kind is None or e.kind == kind]


def assert_write_rejected_under_a_taken_lock(
    app: replayq.App, job_id: int, namespace: str, key: str | int
) -> TraceEvent:
    """The job's write under a lock another holder took meanwhile (the write's fencing
    token 1, the lock's now 2) was rejected: nothing stored, the job dead of
    ``concurrency``, and the attempt's domain events those the careful commit alone
    records (nothing of a refused try, each once). Its ``state.write_rejected``, returned."""
    assert app.state.get(namespace, key).version == 0, "the fenced write did not land"
    job = app.get_job(job_id)
    assert (job.state, job.last_error_class) == (replayq.JobState.DEAD, "concurrency")
    error = job.last_error or ""
    assert "fencing token 1" in error and "newest (2)" in error, error
    events = [e for e in app.trace(job_id) if e.kind == "domain"]
    assert [e.name for e in events] == [
        "lock.acquired",
        "step.started",
        "state.read",
        "state.write",
        "state.write_rejected",
        "step.rolled_back",
        "step.finished",
        "lock.expired",
    ], "what the careful commit alone records: nothing of a refused try"
    assert len({e.seq for e in events}) == len(events)
    [rejected] = [e for e in events if e.name == "state.write_rejected"]
    assert (rejected.data["fencing_token"], rejected.data["newest_token"]) == (1, 2)
    return rejected


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``?`` placeholders) straight against the test database, and commit."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        packs.register_sqlite(conn)  # the rq_events view reads deflated packs through it
        try:
            rows = list(conn.execute(sql, params).fetchall())
            conn.commit()
            return rows
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as pg:
        cursor = pg.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
        return list(cursor.fetchall()) if cursor.description else []


def count_rows(url: str, table: str, where: str = "TRUE", params: tuple[Any, ...] = ()) -> int:
    """How many rows of ``table`` match ``where``: the ground truth of what was stored."""
    where = "1 = 1" if where == "TRUE" else where
    [(count,)] = query(url, f"SELECT COUNT(*) FROM {table} WHERE {where}", params)  # noqa: S608
    return int(count)


# -- the versioned cache, shared by the database and Redis tests --------------------------------


def declare_profile_jobs(app: replayq.App) -> None:
    """Jobs shared with the Redis integration test: fill the cache, then read it."""

    @app.job("render_profile")
    def render_profile(ctx: replayq.Context, user_id: int) -> None:
        with ctx.step("render"):
            user = ctx.state.get("user", user_id)
            ctx.cache.set(
                "profile", user_id, {"name": user.data["name"]}, version=user.version, source="user"
            )

    @app.job("show_profile")
    def show_profile(ctx: replayq.Context, user_id: int, versioned: bool) -> dict[str, Any]:
        with ctx.step("read"):
            if versioned:
                user = ctx.state.get("user", user_id)
                read = ctx.cache.get("profile", user_id, version=user.version, source="user")
            else:
                read = ctx.cache.get("profile", user_id, source="user")
        return {"hit": read.hit, "value": read.value, "version": read.version, "stale": read.stale}


def fill_then_update(app: replayq.App, user_id: int) -> None:
    """Cache the profile of user v1, then change the user to v2 without invalidating."""
    app.state.put("user", user_id, {"name": "Ada"}, expected_version=0)
    app.enqueue("render_profile", {"user_id": user_id})
    run_once(replayq.Worker(app))
    app.state.put("user", user_id, {"name": "Ada Lovelace"}, expected_version=1)


def assert_stale_read_recorded(app: replayq.App, user_id: int, key_prefix: str = "") -> None:
    """Shared by the database and Redis tests: a read of v1 while the entity is at v2."""
    job_id = app.enqueue("show_profile", {"user_id": user_id, "versioned": False})
    run_once(replayq.Worker(app))

    result = app.get_job(job_id).result
    assert result == {"hit": True, "value": {"name": "Ada"}, "version": 1, "stale": True}
    [read] = named(app, job_id, "cache.read")
    assert read.resource == f"{key_prefix}profile:{user_id}"
    assert read.status == "hit"
    assert read.resource_version == 1
    assert (read.data["version"], read.data["current_version"]) == (1, 2)
    assert read.data["stale"] is True
    [stale] = named(app, job_id, "cache.stale_read")
    assert stale.status == "fail"
    assert (stale.data["cached_version"], stale.data["current_version"]) == (1, 2)

    versioned = app.enqueue("show_profile", {"user_id": user_id, "versioned": True})
    run_once(replayq.Worker(app))
    assert app.get_job(versioned).result == {
        "hit": False,
        "value": None,
        "version": None,
        "stale": False,
    }, "a versioned key of the current version simply misses"
    [miss] = named(app, versioned, "cache.read")
    assert (miss.resource, miss.status) == (f"{key_prefix}profile:{user_id}:v2", "miss")
    assert named(app, versioned, "cache.stale_read") == []


class Held:
    """Code that starts, then waits for the test before it ends (a late step's body, a late
    outside call): ``started`` once it runs, ``finish`` set by the test to let it end; what
    the ``ctx`` verb around it returned or raised is kept in ``seen``, ``done`` set after."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome
        self.started = threading.Event()
        self.finish = threading.Event()
        self.done = threading.Event()
        self.seen: list[BaseException | object] = []

    def hold(self, what: str) -> None:
        self.started.set()
        assert self.finish.wait(30), f"the test never let {what} end"

    def watched(self, use: Callable[[], Any]) -> Callable[[], None]:
        """``use`` with what it returned or raised kept, and ``done`` set after it."""

        def watching() -> None:
            try:
                self.seen.append(use())
            except BaseException as exc:
                self.seen.append(exc)
            finally:
                self.done.set()

        return watching


def one_batch_worker(app: replayq.App) -> replayq.Worker:
    """A burst worker that leases the queue's two jobs in one batch and leaves the first
    job's ack to the group the executor commits after the second: between the first
    handler's return and its ack, the second handler runs."""
    return replayq.Worker(
        app,
        burst=True,
        worker_id="w1",
        prefetch=1,
        prefetch_window=float("inf"),  # both jobs leased in one batch
        ack_window=60.0,  # the acks thread leaves the first ack to the executor's group
    )
