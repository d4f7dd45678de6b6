"""The demo's story: the incident, then the runbook's steps, each printed and run."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from collections import Counter
from typing import Any

import replayq
from replayq import App, JobState, StateStore, diff_traces
from replayq.demo.harness import (
    APP_SPEC,
    FIXED_ORDER,
    INCIDENT_ORDER,
    SERVICES,
    SETTLED,
    SLOW_WAREHOUSE_SECONDS,
    Demo,
    DemoError,
    http_json,
    wait_for,
)


def _settled(app: App) -> bool:
    return not app.list_jobs(states=["queued", "running"], limit=1)


def _job_events(app: App, job_id: int, name: str) -> list[replayq.TraceEvent]:
    return [e for e in app.trace(job_id) if e.name == name]


def _status(entry: tuple[Any, int | None] | None) -> str:
    if entry is None:
        return "(no entry)"
    value, version = entry
    return f"{value.get('status') if isinstance(value, dict) else value!r} @v{version}"


def _fork_trace(output: str) -> tuple[str, str]:
    match = re.search(r"derived trace: (\S+) \(branch (\S+)\)", output)
    if match is None:
        raise DemoError(f"could not read the fork's trace id from:\n{output}")
    return match.group(1), match.group(2)


def _shipments_intended(summary_effects: dict[str, Counter[str]]) -> int:
    # A shipment whose outcome was fenced (its worker had lost the lease) still happened.
    return sum(
        count
        for kind, counts in summary_effects.items()
        if kind.startswith("warehouse.")
        for what, count in counts.items()
        if what.startswith("succeeded")
    )


INTRO = """\
replayq demo: the ShipOrder incident of seed 003, on real local services.

A shop ships orders through a warehouse HTTP API. ship_order v1 has the seed's
mistakes: a 0.5s lease never extended, a lock per job type, an effect key that
contains the attempt, retries on every error, a status cache written with an old
version, dedup on a payload hash that includes a timestamp. The warehouse slows
down; we watch what happens, then investigate with the runbook (docs/runbook.md),
printing each command before running it. Times are scaled down: the seed's
45 s warehouse call against a 30 s visibility timeout becomes 3 s against 0.5 s."""


class Story:
    """The demo's steps, in the runbook's order."""

    def __init__(self, demo: Demo) -> None:
        import importlib

        self.demo = demo
        self.say = demo.say
        self.result = demo.result
        self.shop: Any = importlib.import_module("replayq.demo.shop.app")
        migrating = App(demo.db.url, auto_migrate=True)
        try:
            migrating.storage  # noqa: B018 (opening migrates)
        finally:
            migrating.close()
        self.app: App = self.shop.build(demo.db.url, deployed="v1")
        if self.app.state.get("order", INCIDENT_ORDER).exists:
            raise DemoError(
                f"{demo.db.url} already holds the demo's orders: give an empty database"
            )
        self.job_id = 0

    def close(self) -> None:
        self.app.close()

    # -- 0 and 1: the incident --------------------------------------------------------------

    def setup(self) -> list[subprocess.Popen[bytes]]:
        demo, shop = self.demo, self.shop
        self.say(INTRO)
        self.say()
        self.say(f"database: {demo.db.url}")
        if demo.db.schema:
            self.say(f"  a fresh schema {demo.db.schema}, dropped at the end unless --keep")
        elif demo.db.url.startswith("postgresql"):
            self.say("  used as is (the URL sets search_path); nothing is dropped at the end")
        if demo.keep:
            self.say("  kept afterwards; to run the commands below yourself:")
            self.say(f"    export REPLAYQ_DB='{demo.db.url}'")
        else:
            self.say("  removed at the end (replayq demo --keep keeps it to try the commands)")
        demo.section("0. The shop, its real services and two workers")
        for kind in SERVICES:
            demo.start_service(kind)
        shop.stock_up(self.app, "sku-red-mug", 10)
        shop.place_order(self.app, INCIDENT_ORDER)
        self.say(
            f"  order {INCIDENT_ORDER} placed: reserve_stock -> charge_payment (real payment API)"
        )
        workers = [demo.start_worker("worker-1", "v1"), demo.start_worker("worker-2", "v1")]
        wait_for(
            lambda: (
                self.app.state.get("order", INCIDENT_ORDER).data["status"] == "paid"
                and _settled(self.app)
            ),
            timeout=30,
            what=f"order {INCIDENT_ORDER} to be reserved and paid",
        )
        paid = demo.counts()["payment"]["by_order"].get(str(INCIDENT_ORDER), 0)
        self.say(f"{demo.clock()} order {INCIDENT_ORDER} reserved and paid ({paid} capture)")
        return workers

    def incident(self, workers: list[subprocess.Popen[bytes]]) -> None:
        demo, app, shop, result = self.demo, self.app, self.shop, self.result
        warehouse = demo.services["warehouse"]
        demo.section("1. The incident: the warehouse slows past ship_order v1's lease")
        http_json(f"{warehouse}/_latency", {"seconds": SLOW_WAREHOUSE_SECONDS})
        self.say(
            f"{demo.clock()} warehouse latency raised to {SLOW_WAREHOUSE_SECONDS:g}s "
            "(POST /_latency); v1's lease is 0.5s and never extended"
        )
        job_id = shop.request_shipment(app, INCIDENT_ORDER, sent_at=time.time())
        self.job_id = result.job_id = job_id
        first_id = app.get_job(job_id).message_id
        self.say(f"{demo.clock()} order service: ship order {INCIDENT_ORDER} -> job {job_id}")
        self.say(f"          message id {first_id} (v1 dedup: a hash of the payload)")
        wait_for(
            lambda: demo.counts()["warehouse"]["in_flight"] >= 1,
            timeout=15,
            what="the first create_shipment call",
        )
        http_json(f"{warehouse}/_latency", {"seconds": 0.02})
        self.say(
            f"{demo.clock()} a worker is inside the slow create_shipment call; the gateway "
            "recovers for new requests"
        )
        expired = wait_for(
            lambda: _job_events(app, job_id, "lease.expired"), timeout=15, what="the lease expiry"
        )
        self.say(
            f"{demo.clock()} job {job_id}: lease of {expired[0].data.get('expired_owner')} "
            "expired; the job is re-delivered"
        )
        wait_for(
            lambda: app.get_job(job_id).state is JobState.SUCCEEDED,
            timeout=15,
            what=f"job {job_id}'s second attempt",
        )
        leased = _job_events(app, job_id, "job.leased")
        result.workers_by_attempt = {int(e.attempt or 0): str(e.worker_id) for e in leased}
        second = result.workers_by_attempt.get(2, "?")
        self.say(f"{demo.clock()} job {job_id} attempt 2 on {second}: shipped, order marked")
        resent = shop.request_shipment(app, INCIDENT_ORDER, sent_at=time.time())
        result.resent_job_id = resent
        self.say(
            f"{demo.clock()} order service timed out waiting for order.shipped and re-sent "
            f"the event -> job {resent}, message id {app.get_job(resent).message_id}: "
            "NOT deduplicated (sent_at is in the hash)"
        )
        wait_for(
            lambda: _job_events(app, job_id, "job.write_rejected"),
            timeout=20,
            what="the first attempt to come back",
        )
        first = result.workers_by_attempt.get(1, "?")
        self.say(
            f"{demo.clock()} {first} came back from the slow call after its lease was gone: "
            "it wrote the order again; its ack was rejected"
        )
        wait_for(lambda: _settled(app), timeout=20, what="every job to settle")
        for worker in workers:
            demo.stop(worker)
        self.say(f"{demo.clock()} all jobs settled; workers stopped")
        self.show_damage()

    def show_damage(self) -> None:
        demo, app, shop, result = self.demo, self.app, self.shop, self.result
        counts = demo.counts()
        made = [m["id"] for m in counts["warehouse"]["made"] if m["order_id"] == INCIDENT_ORDER]
        result.shipments_v1 = counts["warehouse"]["by_order"].get(str(INCIDENT_ORDER), 0)
        result.emails_v1 = counts["email"]["by_order"].get(str(INCIDENT_ORDER), 0)
        order = app.state.get("order", INCIDENT_ORDER)
        cached = shop.cached_status(app, INCIDENT_ORDER)
        result.cache_before, result.order_version_before = cached, order.version
        result.cache_stale_before = cached is not None and (
            cached[1] != order.version or cached[0].get("status") != order.data["status"]
        )
        invoices = app.list_jobs(job_type="send_invoice_email")
        self.say()
        self.say("  The damage:")
        self.say(
            f"    warehouse (GET /_counts): {result.shipments_v1} shipments for order "
            f"{INCIDENT_ORDER}: {', '.join(made)}"
        )
        self.say(
            f"    order:{INCIDENT_ORDER} @v{order.version}: status={order.data['status']!r} "
            f"shipments={order.data['shipments']}"
        )
        verdict = "DISAGREES with the order" if result.cache_stale_before else "agrees"
        self.say(
            f"    status page (cache order_status:{INCIDENT_ORDER}): {_status(cached)} -> {verdict}"
        )
        self.say(
            f"    {len(invoices)} send_invoice_email jobs, {result.emails_v1} email sent "
            "(that job has a business key: the second was deduplicated)"
        )

    # -- 2..7: the runbook ------------------------------------------------------------------

    def identify(self) -> None:
        demo, app, result, job = self.demo, self.app, self.result, str(self.job_id)
        demo.section("2. Runbook step 1: identify the job, its trace, attempts and resource")
        demo.cli("jobs", "list", "--type", "ship_order")
        demo.cli("jobs", "show", job)
        demo.cli("trace", "show", job)
        demo.cli("trace", "resource", f"order:{INCIDENT_ORDER}", "--leases")
        events = app.resource_trace(f"order:{INCIDENT_ORDER}", leases=True)
        mine = [e for e in events if e.job_id == self.job_id and e.kind == "domain"]
        result.resource_workers = sorted({str(e.worker_id) for e in mine})
        by_attempt = {a: [e.hlc for e in mine if e.attempt == a] for a in (1, 2)}
        expiry = [e.hlc for e in events if e.name == "lease.expired" and e.job_id == self.job_id]
        result.lease_expired_between = bool(
            by_attempt[1]
            and by_attempt[2]
            and any(min(by_attempt[1]) < hlc < min(by_attempt[2]) for hlc in expiry)
        )
        first, second = result.workers_by_attempt.get(1), result.workers_by_attempt.get(2)
        self.say()
        self.say(
            f"  -> order:{INCIDENT_ORDER} was touched by {first} (attempt 1) and {second} "
            f"(attempt 2) of job {job}; between them: lease.expired. {first} read v3 "
            "before the expiry and wrote after the other worker had."
        )

    def quarantine(self) -> None:
        demo = self.demo
        demo.section("3. Runbook step 2: quarantine")
        self.say("  Nothing re-executes for real unless someone runs `replayq rerun` with")
        self.say("  --allow-effects and --yes. Anything of the type still queued can be cancelled:")
        demo.cli("jobs", "list", "--type", "ship_order", "--state", "queued")

    def classify(self) -> None:
        demo, result = self.demo, self.result
        demo.section("4. Runbook step 3: classify (dependency slowdown -> concurrency bug)")
        output = demo.cli("contract", "lint", "ship_order", ok=(0, 1), note="findings")
        result.lint_rules = re.findall(r"^ship_order v1: ([a-z0-9-]+):", output, re.MULTILINE)
        self.say()
        self.say("  The lock v1 takes is one per job type; who held it:")
        demo.cli("trace", "resource", "ship_order", "--leases")
        self.say()
        self.say(
            "  -> a slow dependency made the run outlive its lease; the lock (per type, "
            "TTL 0.5s, never renewed) expired too; without a business key the re-delivery "
            "shipped again."
        )

    def safe_replay(self) -> None:
        demo, result, job = self.demo, self.result, str(self.job_id)
        demo.section("5. Runbook step 4: safe replay (dry-run of attempt 1, zero real calls)")
        before = demo.show_counts("before")
        demo.cli(
            "replay",
            job,
            "--mode",
            "dry-run",
            "--attempt",
            "1",
            "--app",
            APP_SPEC,
            ok=(0, 1),
            note="only the outcome differs: the recorded attempt is 'incomplete' because its "
            "ack was rejected; the code ran to success, so the worker never noticed",
        )
        after = demo.show_counts("after ")
        result.dry_run_requests = {k: after[k] - before[k] for k in after}
        self.say(
            "  -> the handler ran again with the recorded answers: same reads (v3, then v4), "
            "same decision, same duplicate write; the warehouse got no request."
        )

    def fork(self) -> str:
        demo, app, result, job = self.demo, self.app, self.result, str(self.job_id)
        demo.section("6. Runbook step 5: investigative fork onto v2 from create_shipment")
        before = demo.show_counts("before")
        output = demo.cli(
            "fork",
            job,
            "--attempt",
            "1",
            "--from-step",
            "create_shipment",
            "--version",
            "v2",
            # v2's shipment key is not in the v1 recording: a fork is told what it returns.
            "--stub",
            'warehouse.create_shipment={"id": "shp-fork"}',
            "--app",
            APP_SPEC,
        )
        after = demo.show_counts("after ")
        result.fork_requests = {k: after[k] - before[k] for k in after}
        trace_id, branch = _fork_trace(output)
        result.fork_trace_id = trace_id
        consistent, text = fork_cache_consistent(app, branch, INCIDENT_ORDER)
        result.fork_cache_consistent = consistent
        self.say(f"  -> {text}: {'consistent' if consistent else 'INCONSISTENT'}")
        return trace_id

    def compare(self, fork_trace: str) -> None:
        demo, app, result, job = self.demo, self.app, self.result, str(self.job_id)
        demo.section("7. Runbook step 6: compare the original with the fork")
        demo.cli("diff", job, fork_trace)
        diff = diff_traces(app, f"{job}@all", fork_trace)
        result.original_shipments_intended = _shipments_intended(diff.a.effects)
        result.fork_shipments_intended = _shipments_intended(diff.b.effects)
        self.say()
        self.say("  And the contracts, field by field:")
        demo.cli("contract", "diff", "ship_order", "v1", "v2", ok=(0, 1), note="they differ")
        self.say()
        self.say(
            f"  -> v1 (both attempts) made {result.original_shipments_intended} shipments, "
            f"each under its own key; v2 intends {result.fork_shipments_intended}, under "
            f"ship_order:{INCIDENT_ORDER}, and caches the version it wrote."
        )

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
            f"  status page during the incident: {_status(result.cache_before)} while the order "
            f"was @v{result.order_version_before} -> stale"
        )
        self.say(
            f"  status page now:                 {_status(dropped)} (still what the "
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
            f"  status page now: {_status(cached)}, order @v{order.version} "
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
                    app.state.get("order", FIXED_ORDER).data["status"] == "paid" and _settled(app)
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
                lambda: app.get_job(job_id).state in SETTLED and _settled(app),
                timeout=30,
                what=f"job {job_id} and its children",
            )
            for worker in workers:
                demo.stop(worker)
            job = app.get_job(job_id)
            extended = len(_job_events(app, job_id, "lease.extended"))
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
                f"page {_status(cached)}"
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


PYTEST_SNIPPET = """\
# tests/test_ship_order_regression.py
from replayq.testing import assert_replays
from replayq.demo.shop.app import app

def test_ship_order_v2_replays_the_slow_warehouse_case():
    assert_replays("case.json", app, version="v2")"""


def fork_cache_consistent(app: App, branch: str, order_id: int) -> tuple[bool, str]:
    """Whether the fork's status cache entry carries the version of the fork's order."""
    order = StateStore(app, branch).get("order", order_id)
    entry = app.cache_backend.latest(f"{branch}:order_status:{order_id}", app.clock.now())
    cached = f"{entry.value.get('status')!r} @v{entry.version}" if entry else "(no entry)"
    text = f"fork's order @v{order.version}, fork's status cache {cached}"
    return entry is not None and entry.version == order.version, text
