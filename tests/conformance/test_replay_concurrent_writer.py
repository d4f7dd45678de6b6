"""A dry-run reproduces an attempt that read a version another worker wrote mid-attempt.

The attempt reads ``order`` v1, another writer makes v2 while it waits on a
call, then it re-reads (v2) and writes v3 on top: the read-modify-write of the
ShipOrder incident. Its dry-run branch starts at the attempt's start (where the
order is v1), yet it must reproduce the write on v2 exactly, not report a
spurious version conflict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq
from replayq.replay.engine import dry_run
from replayq.testing import run_inline

AppFactory = Callable[..., replayq.App]


def declare(app: replayq.App) -> replayq.App:
    def other_worker_writes(order_id: int) -> dict[str, Any]:
        current = app.state.get("order", order_id)
        app.state.put(
            "order", order_id, {**current.data, "by": "other"}, expected_version=current.version
        )
        return {"wrote": current.version + 1}

    @app.job("mark", lease="5s")
    def mark(ctx: replayq.Context, order_id: int) -> dict[str, Any]:
        with ctx.step("load"):
            ctx.state.get("order", order_id)
        ctx.call("meanwhile", other_worker_writes, order_id)
        with ctx.step("write"):
            current = ctx.state.get("order", order_id)
            written = ctx.state.put("order", order_id, {**current.data, "marks": 1})
        return {"version": written.version}

    return app


def test_dry_run_writes_on_the_version_the_attempt_read_mid_flight(
    app_factory: AppFactory,
) -> None:
    app = declare(app_factory())
    app.state.put("order", 7, {"status": "paid"}, expected_version=0)
    job = run_inline(app, "mark", {"order_id": 7})
    assert job.result == {"version": 3}
    assert app.state.get("order", 7).version == 3

    report = dry_run(app, job.id)

    assert report.first_divergence is None, report.to_dict()
    assert not report.diverged, report.to_dict()
    assert report.outcome_now.result == {"version": 3}
    assert app.state.get("order", 7).version == 3, "the dry-run wrote only to its branch"
