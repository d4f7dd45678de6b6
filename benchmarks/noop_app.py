"""The replayq app the throughput benchmark drains: one job type that does nothing.

The worker is started as ``replayq --db URL worker --app benchmarks.noop_app:app --burst``;
``--db`` decides the database, so the URL below is only a fallback.
"""

from __future__ import annotations

import os

import replayq


def make_app(url: str) -> replayq.App:
    """An app on ``url`` that declares the ``noop`` job type."""
    app = replayq.App(url)

    @app.job("noop", lease="60s", heartbeat="20s")
    def noop(ctx: replayq.Context, n: int) -> None:
        """Do nothing: the benchmark measures the queue, not the handler."""
        return None

    return app


app = make_app(os.environ.get("REPLAYQ_DB", "sqlite:///noop-bench.db"))
