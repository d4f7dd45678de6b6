"""A job routed to a candidate holds the candidate's lease, not the baseline's.

A routed type's jobs are claimed with the active version's lease. Before, a job that
then ran v2 kept it: a v2 declared with a longer fixed window (``heartbeat=0``) was
redelivered while it ran — two workers in its handler at once — and one with a shorter
lease waited out v1's after its worker died. Both backends; a real worker in this process.
"""

from __future__ import annotations

from collections.abc import Callable

import replayq

QUICK = replayq.Retry(max_attempts=3, base="0.01s", cap="0.02s", on=("transient",))


def declare(app: replayq.App) -> replayq.App:
    @app.job("render", version="v1", lease="2s", heartbeat=0, retry=QUICK)
    def render_v1(ctx: replayq.Context, n: int) -> dict[str, str]:
        return {"version": "v1"}

    @app.job("render", version="v2", lease="20s", heartbeat=0, retry=QUICK, candidate=True)
    def render_v2(ctx: replayq.Context, n: int) -> dict[str, str]:
        if ctx.attempt == 1:
            raise replayq.TransientError("the renderer is warming up")
        return {"version": "v2"}

    return app


def test_every_attempt_on_the_candidate_holds_the_candidates_lease(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = declare(app_factory())
    app.register_contracts()
    app.rollout("render", actor="test").start("v2", canary="100%")
    job_id = app.enqueue("render", {"n": 1})

    replayq.Worker(app, burst=True, burst_wait=5, worker_id="w", poll_interval=0.01).run()

    assert app.get_job(job_id).result == {"version": "v2"}
    leased = [e for e in app.trace(job_id) if e.name == "job.leased"]
    assert [(e.attempt, e.data["version"]) for e in leased] == [(1, "v2"), (2, "v2")]
    # The window the lease granted, as stored with the attempt: v2's 20 s, not v1's 2 s
    # (within a second: the deadline is the database's clock, the event's time the worker's).
    windows = [e.data["lease_deadline"] - e.ts for e in leased]
    assert all(19 < window < 21 for window in windows), windows


def test_a_candidate_with_a_fixed_window_is_never_leased_ahead(
    app_factory: Callable[..., replayq.App],
) -> None:
    """v1 is heartbeated, v2 a fixed visibility timeout (``heartbeat=0``). A fixed window
    counts from the lease, so a worker leases no job of such a type ahead of a free
    executor (``Leasing._claim``) — but only the active version's heartbeat was asked:
    a job routed to v2 was leased ahead with v2's window, which ran out while it waited
    behind the others (dropped unrun and redelivered, or redelivered while it ran).
    Each job must be leased once, by a batch of no more jobs than free executors, and a
    burst run must not end before every job ran."""
    import time

    app = app_factory()
    runs: list[int] = []

    @app.job("render", version="v1", lease="30s", retry=QUICK)
    def render_v1(ctx: replayq.Context, n: int) -> dict[str, str]:
        return {"version": "v1"}

    @app.job("render", version="v2", lease="3s", heartbeat=0, retry=QUICK, candidate=True)
    def render_v2(ctx: replayq.Context, n: int) -> dict[str, str]:
        runs.append(n)
        time.sleep(1.2)  # three of them outlast one window: the fourth waits past it
        return {"version": "v2"}

    app.register_contracts()
    app.rollout("render", actor="test").start("v2", canary="100%")
    ids = [app.enqueue("render", {"n": n}) for n in range(4)]

    # A burst run: it must not end while a lease, its one executor busy, leaves such a
    # type's due jobs unlooked-for (ahead slots only) and finds nothing else.
    replayq.Worker(
        app,
        burst=True,
        burst_wait=5,
        worker_id="w",
        poll_interval=0.01,
        concurrency=1,
        prefetch=3,
        prefetch_window=float("inf"),
    ).run()

    assert [app.get_job(j).result for j in ids] == [{"version": "v2"}] * 4
    assert sorted(runs) == [0, 1, 2, 3], "each job run once"
    leased = [e for j in ids for e in app.trace(j) if e.name == "job.leased"]
    assert len(leased) == 4, [(e.job_id, e.data.get("redelivery_count")) for e in leased]
    batches = {e.data["owner_token"] for e in leased}
    assert len(batches) == 4, "a batch of one job: one free executor, none leased ahead"
