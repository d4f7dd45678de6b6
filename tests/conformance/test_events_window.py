"""Questions across jobs by time, on every backend: ``events --since/--until`` returns exactly
the window's events in HLC order across two workers, and ``signals --by second`` over a
503 outage shows the retry rate per second."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

from click.testing import CliRunner

import replayq
from replayq.cli import main

T0 = 1_700_000_000.0


def iso(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.UTC).isoformat()


def work(ctx: replayq.Context, n: int) -> int:
    return ctx.step("double", lambda: n * 2)


def test_events_in_a_window_are_exactly_those_of_the_window_in_hlc_order(
    app_factory: Callable[..., replayq.App], db_url: str
) -> None:
    clock = replayq.FrozenClock(T0)
    # Two workers, each with its own hybrid logical clock, take turns; worker-1's wall
    # clock is 30 s slow. The HLC carries the order across them all the same.
    slow = replayq.FrozenClock(T0 - 30)
    apps = [app_factory(clock=clock), app_factory(clock=slow)]
    for app in apps:
        app.job("work")(work)
    job_ids = []
    for n in range(10):
        clock.set(T0 + n)
        slow.set(T0 + n - 30)
        # Due on both clocks (a slow worker leases nothing due in its last 30 s).
        job_ids.append(apps[0].enqueue("work", {"n": n}, run_at=T0 - 3600))
        replayq.Worker(apps[n % 2], burst=True, worker_id=f"worker-{n % 2}").run()
    since, until = T0 + 3, T0 + 7
    low, high = int(since * 1000) << 16, int(until * 1000) << 16
    every = [e for job_id in job_ids for e in apps[0].trace(job_id)]
    expected = sorted((e for e in every if low <= e.hlc < high), key=lambda e: (e.hlc, e.id))
    assert len(expected) < len(every)

    result = CliRunner().invoke(
        main, ["--db", db_url, "events", "--since", iso(since), "--until", iso(until), "--json"]
    )
    assert result.exit_code == 0, result.output
    streamed = [json.loads(line) for line in result.output.splitlines()]
    assert [e["id"] for e in streamed] == [e.id for e in expected]
    assert {e["worker_id"] for e in streamed} >= {"worker-0", "worker-1"}
    # The slow worker's events are in the window by their HLC, although its wall clock
    # stamped them 30 s before it.
    slow_events = [e for e in expected if e.worker_id == "worker-1"]
    assert slow_events and all(e.ts < since for e in slow_events)
    assert all(e["job_type"] == "work" for e in streamed)

    leased = replayq.events_between(apps[1], since=since, until=until, name="job.leased")
    assert [w.event.job_id for w in leased] == job_ids[3:7]


def test_signals_by_second_show_the_retry_rate_through_a_503_outage(
    app_factory: Callable[..., replayq.App], db_url: str
) -> None:
    clock = replayq.FrozenClock(T0)
    app = app_factory(clock=clock)
    outage_until = T0 + 3

    def fetch_price(ctx: replayq.Context, sku: str) -> str:
        def upstream() -> str:
            if clock.now() < outage_until:
                raise replayq.DependencyError("503 Service Unavailable")
            return "9.99"

        return str(ctx.call("price-api", upstream))

    # No jitter: every retry waits its full 60 s, so none comes due again inside the window.
    no_jitter = replayq.Retry(max_attempts=5, base="60s", cap="60s", jitter="none")
    app.job("fetch_price", retry=no_jitter)(fetch_price)
    per_second = [3, 5, 2, 4]  # jobs arriving in each second; the outage covers the first 3
    for second, arriving in enumerate(per_second):
        clock.set(T0 + second + 0.5)
        for k in range(arriving):
            app.enqueue("fetch_price", {"sku": f"{second}-{k}"})
        replayq.Worker(app, burst=True).run()

    result = CliRunner().invoke(
        main, ["--db", db_url, "signals", "--by", "second", "--since", iso(T0), "--json"]
    )
    assert result.exit_code == 0, result.output
    retries = {
        point["bucket"] - T0: point["count"]
        for point in json.loads(result.output)
        if point["event"] == "retry.scheduled"
    }
    assert retries == {0.0: 3, 1.0: 5, 2.0: 2}
    text = CliRunner().invoke(main, ["--db", db_url, "signals", "--by", "second"]).output
    assert "retries scheduled" in text and "fetch_price" in text
