"""`replayq signals` counts incident signals from the trace, per job type."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import CliRunner

import replayq
from replayq.cli import main
from replayq.recording.cache import CacheEntry
from replayq.replay.signals import signal_counts


def test_signals_count_idempotency_conflicts_stale_reads_and_dead_letters(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    shipped: list[int] = []

    @app.job("ship", idempotency="ship:{order_id}", effects=["warehouse"])
    def ship(ctx: replayq.Context, order_id: int) -> None:
        with ctx.step("read"):
            ctx.cache.get("order_status", order_id, source="order")
        with ctx.step("ship"):
            ctx.effect("warehouse", lambda: shipped.append(order_id) or {"n": len(shipped)})

    @app.job("check")
    def check(ctx: replayq.Context, order_id: int) -> None:
        raise replayq.ValidationError("order is not paid")

    app.state.put("order", 1, {"status": "paid"}, expected_version=0)
    app.enqueue("ship", {"order_id": 1})
    replayq.Worker(app, burst=True).run()
    # The order moves on; the cached status (written from v1) is now stale.
    app.cache_backend.put(
        CacheEntry("order_status:1:v1", "order_status:1", "paid", 1, "order", "1", 0.0, None)
    )
    app.state.put("order", 1, {"status": "shipped"}, expected_version=1)
    app.enqueue("ship", {"order_id": 1})
    app.enqueue("check", {"order_id": 1})
    replayq.Worker(app, burst=True).run()

    counts = {(c.job_type, c.event): c.count for c in signal_counts(app)}
    assert shipped == [1]
    assert counts[("ship", "effect.deduplicated")] == 1
    assert counts[("ship", "cache.stale_read")] == 1
    assert counts[("check", "job.dead")] == 1
    assert ("ship", "lease.expired") not in counts
    assert signal_counts(app, since=app.clock.now() + 60) == []

    cli = CliRunner().invoke(main, ["--db", app.url, "signals", "--json"])
    assert cli.exit_code == 0, cli.output
    rows = {(r["job_type"], r["event"]): r["count"] for r in json.loads(cli.output)}
    assert rows == counts
