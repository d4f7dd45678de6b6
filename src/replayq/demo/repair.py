"""The runbook's steps 7 and 8 in the demo: repair, deploy v2, close with a regression case."""

from __future__ import annotations

import json
import textwrap
import time

import replayq
from replayq.demo.chapter import Chapter, all_settled, entry_status, job_events
from replayq.demo.harness import (
    APP_SPEC,
    FIXED_ORDER,
    INCIDENT_ORDER,
    SETTLED,
    SLOW_WAREHOUSE_SECONDS,
    http_json,
    wait_for,
)

PYTEST_SNIPPET = """\
# tests/test_ship_order_regression.py
from replayq.testing import assert_replays
from replayq.demo.shop.app import app

def test_ship_order_v2_replays_the_slow_warehouse_case():
    assert_replays("case.json", app, version="v2")"""


class Repair(Chapter):
    """Chapters 8 to 10 and the summary: the fix, proven and kept as a test."""

    def repair(self) -> None:
        demo, app, shop, result, job = self.demo, self.app, self.shop, self.result, str(self.job_id)
        demo.section("8. Runbook step 7: decide and repair")
        self.say(
            "  Decision: deploy v2. Attempt 1 came back after its lease was taken; its late\n"
            "  writes never landed: every commit checks the job's owner token in the database,\n"
            "  so they were refused (write.fenced in its trace). The extra shipment at the\n"
            "  warehouse is for the warehouse team (a registered compensator would let\n"
            "  `replayq rollback JOB --compensate` cancel it). A rollback has nothing to undo:"
        )
        demo.cli("rollback", job, "--attempt", "1", "--simulate")
        plan = replayq.plan_rollback(app, self.job_id, attempt=1)
        result.rollback_would_restore = [change.resource for change in plan.changes]
        result.late_writes_fenced = [
            item
            for e in app.trace(self.job_id)
            if e.name == "write.fenced" and e.attempt == 1
            for item in e.data.get("refused", [])
        ]
        self.say(f"  refused from attempt 1: {', '.join(result.late_writes_fenced) or 'nothing'}")
        demo.cli("state", "history", "order", str(INCIDENT_ORDER))
        order = app.state.get("order", INCIDENT_ORDER)
        dropped = shop.cached_status(app, INCIDENT_ORDER)
        result.order_after_repair = dict(order.data)
        result.order_version_after_repair = order.version
        self.say()
        self.say(
            f"  order:{INCIDENT_ORDER} @v{order.version}: status={order.data['status']!r} "
            f"shipments={order.data['shipments']} (the state attempt 2 wrote)"
        )
        self.say(
            f"  status page during the incident: {entry_status(result.cache_before)} "
            "while the order "
            f"was @v{result.order_version_before} -> stale"
        )
        self.say(
            f"  status page now:                 {entry_status(dropped)} (still what the "
            "cache held before attempt 2's write)"
        )
        self.say()
        self.say("  The status page's next read (a cache-aside job) refills it from the order:")
        payload = json.dumps({"order_id": INCIDENT_ORDER})
        demo.cli("enqueue", "refresh_order_status", "--payload", payload, "--app", APP_SPEC)
        demo.cli("worker", "--app", APP_SPEC, "--burst", "--poll-interval", "0.05")
        cached = shop.cached_status(app, INCIDENT_ORDER)
        order = app.state.get("order", INCIDENT_ORDER)
        result.cache_after_repair = cached
        result.cache_consistent_after_repair = (
            cached is not None
            and cached[1] == order.version
            and cached[0].get("status") == order.data["status"]
        )
        verdict = "consistent" if result.cache_consistent_after_repair else "STILL STALE"
        self.say()
        self.say(
            f"  status page now: {entry_status(cached)}, order @v{order.version} "
            f"{order.data['status']!r} -> {verdict}"
        )

    def deploy_fix(self) -> None:
        demo, shop, result = self.demo, self.shop, self.result
        demo.section("9. Runbook step 7 (cont.): v2 deployed, the same slow warehouse")
        app = shop.build(demo.db.url, deployed="v2")
        try:
            workers = [demo.start_worker("worker-3", "v2"), demo.start_worker("worker-4", "v2")]
            shop.place_order(app, FIXED_ORDER)
            wait_for(
                lambda: (
                    app.state.get("order", FIXED_ORDER).data["status"] == "paid"
                    and all_settled(app)
                ),
                timeout=30,
                what=f"order {FIXED_ORDER} to be reserved and paid",
            )
            warehouse = demo.services["warehouse"]
            http_json(f"{warehouse}/_latency", {"seconds": SLOW_WAREHOUSE_SECONDS})
            self.say(
                f"{demo.clock()} order {FIXED_ORDER} paid; warehouse latency "
                f"{SLOW_WAREHOUSE_SECONDS:g}s again"
            )
            event_id = f"evt-ship-{FIXED_ORDER}"
            job_id = shop.request_shipment(app, FIXED_ORDER, sent_at=time.time(), event_id=event_id)
            result.v2_job_id = job_id
            self.say(
                f"{demo.clock()} ship order {FIXED_ORDER} (message id {event_id}) -> job {job_id}"
            )
            wait_for(
                lambda: demo.counts()["warehouse"]["in_flight"] >= 1,
                timeout=15,
                what="the v2 create_shipment call",
            )
            http_json(f"{warehouse}/_latency", {"seconds": 0.02})
            time.sleep(0.8)  # past the old 0.5s lease, so the re-send comes mid-call as before
            again = shop.request_shipment(app, FIXED_ORDER, sent_at=time.time(), event_id=event_id)
            result.resend_deduplicated = again == job_id
            self.say(
                f"{demo.clock()} order service re-sent the event -> job {again} "
                f"({'deduplicated: same event id' if again == job_id else 'NOT deduplicated'})"
            )
            wait_for(
                lambda: app.get_job(job_id).state in SETTLED and all_settled(app),
                timeout=30,
                what=f"job {job_id} and its children",
            )
            for worker in workers:
                demo.stop(worker)
            job = app.get_job(job_id)
            extended = len(job_events(app, job_id, "lease.extended"))
            counts = demo.counts()
            result.shipments_v2 = counts["warehouse"]["by_order"].get(str(FIXED_ORDER), 0)
            result.v2_redeliveries = job.redelivery_count
            order = app.state.get("order", FIXED_ORDER)
            cached = shop.cached_status(app, FIXED_ORDER)
            result.v2_cache_consistent = cached is not None and cached[1] == order.version
            self.say(
                f"{demo.clock()} job {job_id} {job.state.value} in one attempt; the heartbeat "
                f"extended its lease {extended} times; re-deliveries: {job.redelivery_count}"
            )
            self.say(
                f"    warehouse (GET /_counts): {result.shipments_v2} shipment for order "
                f"{FIXED_ORDER}; order @v{order.version} {order.data['status']!r}; status "
                f"page {entry_status(cached)}"
            )
        finally:
            app.close()

    def regression_case(self) -> None:
        demo, shop, result = self.demo, self.shop, self.result
        job = str(result.v2_job_id)
        demo.section("10. Runbook step 8: close with a regression case")
        output = demo.cli(
            "trace",
            "export",
            job,
            "--app",
            APP_SPEC,
            shown=f"trace export {job} --app {APP_SPEC} > case.json",
        )
        case_path = demo.folder / "case.json"
        case_path.write_text(output, encoding="utf-8")
        result.case = json.loads(output)
        self.say(
            f"    wrote case.json ({len(output)} bytes): job {job}'s attempt, its contract, "
            "events and the state versions it read"
        )
        self.say()
        for line in PYTEST_SNIPPET.splitlines():
            self.say(f"    {line}")
        from replayq.testing import assert_replays

        assert_replays(case_path, shop.app, version="v2")
        result.regression_v2_passes = True
        self.say()
        self.say("  Run here, in-process:")
        self.say("    assert_replays(case, app, version='v2')  -> passes")
        try:
            assert_replays(case_path, shop.app, version="v1")
        except AssertionError as exc:
            result.regression_v1_divergence = str(exc)
        self.say(
            "    assert_replays(case, app, version='v1')  -> AssertionError: "
            f"{result.regression_v1_divergence}"
        )

    def summary(self) -> None:
        result = self.result
        demo = self.demo
        first, second = result.workers_by_attempt.get(1), result.workers_by_attempt.get(2)
        demo.section("Summary")
        what = (
            f"The warehouse slowed to {SLOW_WAREHOUSE_SECONDS:g}s; ship_order v1's 0.5s lease "
            f"was never extended, so job {result.job_id} was re-delivered to {second} while "
            f"{first} was still inside the call. The effect key contained the attempt and the "
            "per-type lock had expired, so both shipped; the late attempt's writes were refused "
            "by fencing, but the status cache kept an old version. The order service's re-send "
            f"(job {result.resent_job_id}) was not deduplicated: the hash included sent_at."
        )
        self.say("  What happened:")
        for line in textwrap.wrap(what, 76):
            self.say(f"    {line}")
        zero = sum(result.dry_run_requests.values()) + sum(result.fork_requests.values())
        rows = [
            (f"shipments made by v1 (warehouse, order {INCIDENT_ORDER})", result.shipments_v1),
            ("shipments intended by the v2 fork", result.fork_shipments_intended),
            ("real requests during the dry-run and the fork", zero),
            (
                f"order:{INCIDENT_ORDER} after the repair (attempt 1 fenced)",
                f"v{result.order_version_after_repair} "
                f"{result.order_after_repair.get('shipments')}, cache "
                + ("consistent" if result.cache_consistent_after_repair else "STALE"),
            ),
            (
                f"v2 deployed, same slow warehouse (order {FIXED_ORDER})",
                f"{result.shipments_v2} shipment, {result.v2_redeliveries} re-deliveries",
            ),
            ("regression case vs v2 / vs v1", "passes / diverges"),
            ("lint findings on v1", ", ".join(result.lint_rules)),
        ]
        self.say()
        for label, value in rows:
            self.say(f"  {label:<52} {value}")
        self.say(f"  {'time':<52} {time.monotonic() - demo.started:.1f}s")
        self.say()
        self.say(
            "  Read more: docs/runbook.md (the eight steps, with this incident worked through)."
        )
        if demo.keep:
            self.say(f"  Kept: {demo.folder} (logs, case.json); export REPLAYQ_DB={demo.db.url}")
