"""How fast ``rollout verify`` compares a candidate over recorded attempts, per backend.

``--jobs`` jobs (default 10,000) of a 3-step handler (a ``ctx.call``, a
``ctx.decide``, a ``ctx.cache.set``) are recorded at v1 by an in-process burst
worker; then ``replayq.verify_rollout`` runs v2 (identical in behaviour) over
every recorded attempt, sealed, and the script prints attempts per second and
checks that nothing differed and that the outside function was never called
during verification.

    python benchmarks/rollout_verify.py [--jobs 10000] [--db URL]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import replayq

CALLS = {"quote": 0}


def quote(sku: str) -> dict[str, Any]:
    CALLS["quote"] += 1
    return {"sku": sku, "available": len(sku)}


def build(url: str) -> replayq.App:
    app = replayq.App(url, auto_migrate=True)

    def body(ctx: replayq.Context, sku: str, qty: int) -> dict[str, Any]:
        with ctx.step("quote"):
            answer = ctx.call("quote", quote, sku)
        with ctx.step("decide"):
            enough = ctx.decide("enough", answer["available"] >= qty)
        with ctx.step("cache"):
            ctx.cache.set("price", sku, {"amount": answer["available"] * qty})
        return {"enough": enough}

    app.job("price", version="v1")(lambda ctx, sku, qty: body(ctx, sku, qty))
    app.job("price", version="v2", candidate=True)(lambda ctx, sku, qty: body(ctx, sku, qty))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--db", default=None, help="A database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    url = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'verify.db'}"
    app = build(url)
    app.enqueue_many(
        [
            replayq.EnqueueRequest("price", {"sku": f"sku-{n % 500}", "qty": n % 7})
            for n in range(args.jobs)
        ]
    )
    started = time.perf_counter()
    replayq.Worker(app, burst=True).run()
    recorded = time.perf_counter() - started
    calls = CALLS["quote"]
    report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2")
    assert CALLS["quote"] == calls, "verification called the outside function"
    assert report.passed and not report.counts, report.counts
    print(
        f"{app.storage.dialect}: recorded {args.jobs} jobs in {recorded:.1f}s; verified "
        f"{report.attempts} attempts in {report.seconds:.1f}s = {report.throughput:.0f} attempts/s"
    )
    app.close()


if __name__ == "__main__":
    main()
