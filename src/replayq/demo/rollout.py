"""``replayq demo rollout``: seed 004's worst bug caught before, during and after a rollout.

In a temporary SQLite database, in this process, within a minute: ``price`` v1
tells a validation error from a timeout; v2, faster, retries every exception.

1. ``rollout verify`` over v1's recorded history flags every v1 failure as a
   ``retry_decision`` difference (``dead: not_retryable`` → ``retry in ≤ …``);
2. a 50 % canary runs live, and ``rollout ramp`` refuses on the retry-rate gate;
3. with a backlog draining, ``rollout rollback`` returns it to v1 at once;
4. v3, the fix (fast, and retrying only what v1 retried), passes ``rollout
   verify``, runs a canary that the gates accept, and ``rollout finish`` makes it
   the baseline.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import replayq

V1_RETRY = replayq.Retry(max_attempts=4, base="20s", cap="60s", on=("transient",))
V3_SAMPLE = 100  # recorded v1 attempts act 4 verifies v3 over
V3_CANARY_JOBS = 100  # 51 route to v3, 10 of them invalid; 49 to v1, 10 invalid
V3_MIN_SAMPLE = 30
V2_RETRY = replayq.Retry(max_attempts=4, base="20s", cap="60s", on=("transient", "unknown"))
ORDERING = "order:{order_id}"


@dataclass
class RolloutDemoResult:
    """The numbers the demo printed, for its test."""

    verify_counts: dict[str, int] = field(default_factory=dict)
    ramp_refusal: str = ""
    moved_to_v1: int = 0
    leased_on_v2_after_rollback: int = 0
    backlog: int = 0
    drained: int = 0
    v3_verify_counts: dict[str, int] = field(default_factory=dict)
    v3_verified: int = 0
    baseline_after_finish: str = ""
    seconds: float = 0.0


def _declare(app: replayq.App) -> None:
    # Each job has its own ordering key, so the canary's split is a hash of the
    # order id (not of a random trace id): the same jobs reach the same version
    # in every run, and the invalid ones split evenly (see _jobs).
    def body(ctx: replayq.Context, order_id: int, sku: str, qty: int) -> dict[str, Any]:
        with ctx.step("quote"):
            price = ctx.call("quote", lambda: 1000 + len(sku))
        with ctx.step("check"):
            if qty <= 0:
                raise ValueError(f"quantity {qty} must be positive")
        with ctx.step("cache"):
            ctx.cache.set("price", sku, {"amount": price * qty})
        time.sleep(0.002)
        return {"amount": price * qty}

    for version, retry, candidate in (
        ("v1", V1_RETRY, False),
        ("v2", V2_RETRY, True),
        ("v3", V1_RETRY, True),
    ):
        app.job("price", version=version, retry=retry, candidate=candidate, ordering=ORDERING)(
            lambda ctx, order_id, sku, qty: body(ctx, order_id, sku, qty)
        )


def _jobs(count: int, start: int) -> list[replayq.EnqueueRequest]:
    """Orders ``start`` … ``start + count - 1``; every fifth has qty 0 (invalid).

    Routed by ``order:<n>``: of act 2's 300, 153 go to v2 (33 invalid); of act 4's
    100, 51 go to v3 (10 invalid) and 49 stay on v1 (10 invalid).
    """
    return [
        replayq.EnqueueRequest(
            "price",
            {"order_id": n, "sku": f"sku-{n % 40}", "qty": 0 if n % 5 == 0 else n % 9 + 1},
        )
        for n in range(start, start + count)
    ]


def run_rollout_demo(out: IO[str] | None = None, keep: bool = False) -> RolloutDemoResult:
    """Run the three acts; returns what they showed."""
    say = (out or sys.stdout).write
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="replayq-rollout-demo-"))
    app = replayq.App(f"sqlite:///{folder / 'demo.db'}", auto_migrate=True)
    result = RolloutDemoResult()
    try:
        _declare(app)
        say("== 0. history: 100 price jobs ran on v1 (every fifth has qty 0: a validation bug)\n")
        app.enqueue_many(_jobs(100, 0))
        stats = replayq.Worker(app, burst=True, concurrency=4).run()
        say(f"   v1: {stats.succeeded} succeeded, {stats.dead} dead (not retried)\n\n")

        say("== 1. $ replayq rollout verify price --from v1 --to v2\n")
        report = replayq.verify_rollout(app, "price", from_version="v1", to_version="v2")
        result.verify_counts = dict(report.counts)
        say(f"   {report.attempts} recorded attempts in {report.seconds:.2f}s, sealed\n")
        for name, count in sorted(report.counts.items()):
            say(f"   {name:<16} {count:>4}  FAIL\n")
        for example in report.examples(1):
            detail = example.details["retry_decision"]
            say(f"   job {example.job_id}: recorded {detail['recorded']!r}, v2 {detail['now']!r}\n")
            say(f"   {example.fork_command}\n")
        say("   -> exit 1: v2 would retry jobs that can never succeed\n\n")

        say("== 2. $ replayq rollout start price --to v2 --canary 50%   (deployed anyway)\n")
        rollout = app.rollout("price", actor="demo")
        rollout.start("v2", canary="50%", reason="demo: the faster v2")
        app.enqueue_many(_jobs(300, 100))
        replayq.Worker(app, burst=True, concurrency=4).run()
        say("   $ replayq rollout ramp price 100%\n")
        try:
            rollout.ramp("100%", reason="demo")
        except replayq.RolloutRefusedError as refused:
            result.ramp_refusal = str(refused)
            say(f"   error: {refused}\n\n")

        say(
            "== 3. a backlog of 600 jobs drains at 50 %; halfway: "
            "$ replayq rollout rollback price\n"
        )
        ids = app.enqueue_many(_jobs(600, 400))
        result.backlog = len(ids)
        worker = replayq.Worker(app, concurrency=4, routing_refresh=0.2)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        while len(app.list_jobs(states=["queued"], job_type="price", limit=10_000)) > 300:
            time.sleep(0.02)
        rolled = rollout.rollback(reason="demo: retry storm on the ramp gate")
        switched = app.clock.now()
        result.moved_to_v1 = rolled.requeued_to_baseline
        say(
            f"   moved {rolled.requeued_to_baseline} queued v2 jobs (retries waiting) to v1; "
            f"{rolled.in_flight} running v2 attempts finish on v2\n"
        )
        while app.list_jobs(states=["queued", "running"], job_type="price", limit=1):
            time.sleep(0.05)
        worker.stop()
        thread.join(30)
        result.drained = len(ids)
        late = [
            e
            for job_id in ids
            for e in app.trace(job_id)
            if e.name == "job.leased" and e.ts > switched + 0.5
        ]
        result.leased_on_v2_after_rollback = sum(1 for e in late if e.data["version"] == "v2")
        say(
            f"   backlog drained: {len(late)} leases after the switch, "
            f"{result.leased_on_v2_after_rollback} of them on v2\n"
        )
        say("   $ replayq jobs list --type price --version v2 --state queued   -> (none)\n\n")

        say("== 4. v3 retries only timeouts again: $ replayq rollout verify price --to v3\n")
        fixed = replayq.verify_rollout(
            app, "price", from_version="v1", to_version="v3", sample=V3_SAMPLE
        )
        result.v3_verify_counts = dict(fixed.counts)
        result.v3_verified = fixed.attempts
        say(
            f"   {fixed.attempts} recorded attempts, "
            f"{sum(fixed.counts.values())} differences -> exit 0\n"
        )
        say("   $ replayq rollout start price --to v3 --canary 50%\n")
        rollout.start("v3", canary="50%", reason="demo: the fix")
        app.enqueue_many(_jobs(V3_CANARY_JOBS, 1000))
        replayq.Worker(app, burst=True, concurrency=4).run()
        say(f"   $ replayq rollout finish price --min-sample {V3_MIN_SAMPLE}\n")
        finished = rollout.finish(reason="demo: the gates hold", min_sample=V3_MIN_SAMPLE)
        result.baseline_after_finish = finished.routing.baseline
        say(
            f"   every gate passed: {finished.routing.baseline} is the baseline and the only "
            f"route; {finished.requeued_to_baseline} queued job(s) moved to it\n"
        )
    finally:
        app.close()
        if keep:
            say(f"\nkept: {folder}\n")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    result.seconds = time.monotonic() - started
    say(f"\ndone in {result.seconds:.1f}s\n")
    return result
