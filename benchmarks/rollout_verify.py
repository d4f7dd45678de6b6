"""How fast ``rollout verify`` compares a candidate over recorded attempts, per backend.

``--jobs`` jobs (default 10,000) of a 3-step handler (a ``ctx.call``, a
``ctx.decide``, a ``ctx.cache.set``) are recorded at v1 by an in-process burst
worker; then v2 (identical in behaviour) is verified over every recorded
attempt, sealed, twice: in the foreground (``replayq.verify_rollout``, what
``rollout verify`` runs) and in the background (``replayq.start_verify``, what
``rollout verify --background`` enqueues, run by an in-process burst worker,
chunk by chunk, from enqueue to the finished report). The script checks that
nothing differed, that both reports agree and that the outside function was never
called during verification.

    python benchmarks/rollout_verify.py [--jobs 10000] [--backend sqlite|postgres] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import PG_URL, PgSchemas, commit, load_average

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
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (--backend postgres)")
    parser.add_argument("--chunk", type=int, default=200, help="attempts per background chunk")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    ran_on = commit()  # the code measured: read before the run, which takes minutes
    schemas = PgSchemas(args.pg_url) if args.backend == "postgres" else None
    url = (
        f"sqlite:///{Path(tempfile.mkdtemp()) / 'verify.db'}"
        if schemas is None
        else schemas.fresh("verify")
    )
    app = build(url)
    try:
        app.enqueue_many(
            [
                replayq.EnqueueRequest("price", {"sku": f"sku-{n % 500}", "qty": n % 7})
                for n in range(args.jobs)
            ]
        )
        started = time.perf_counter()
        replayq.Worker(app, burst=True).run()
        recorded = time.perf_counter() - started
        print(f"  recorded {args.jobs} jobs in {recorded:.1f}s", file=sys.stderr)
        calls = CALLS["quote"]

        report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2")
        assert report.passed and not report.counts, report.counts
        print(f"  foreground: {report.throughput:.0f} attempts/s", file=sys.stderr)

        started = time.perf_counter()
        job_id = replayq.start_verify(
            app, "price", from_version="v1", to_version="v2", chunk=args.chunk
        )
        replayq.Worker(app, burst=True).run()
        background = time.perf_counter() - started
        run = replayq.verify_run(app, job_id)
        assert run.finished and run.done == report.attempts, run.to_dict()
        assert run.report.counts == report.counts
        assert CALLS["quote"] == calls, "verification called the outside function"
        print(f"  background: {run.done / background:.0f} attempts/s", file=sys.stderr)
    finally:
        app.close()
        if schemas is not None:
            schemas.drop_all()
    figures = {
        "benchmark": "rollout_verify",
        "backend": args.backend,
        "commit": ran_on,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load_average(),
        "jobs": args.jobs,
        "recording_jobs_per_s": round(args.jobs / recorded, 1),
        "attempts": report.attempts,
        "foreground_seconds": round(report.seconds, 2),
        "foreground_attempts_per_s": round(report.throughput, 1),
        "background_chunk": args.chunk,
        "background_seconds": round(background, 2),
        "background_attempts_per_s": round(run.done / background, 1),
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print(
        f"{args.backend}: recorded {args.jobs} jobs ({figures['recording_jobs_per_s']} jobs/s); "
        f"verify {figures['foreground_attempts_per_s']} attempts/s in the foreground, "
        f"{figures['background_attempts_per_s']} in the background "
        f"(commit {figures['commit']}, load {figures['load_average']})"
    )


if __name__ == "__main__":
    main()
