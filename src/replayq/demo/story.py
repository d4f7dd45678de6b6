"""The demo's story: the incident, then the runbook's steps, each printed and run."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from replayq import App, JobState
from replayq.demo.chapter import all_settled, entry_status, job_events
from replayq.demo.harness import (
    INCIDENT_ORDER,
    SERVICES,
    SLOW_WAREHOUSE_SECONDS,
    Demo,
    DemoError,
    http_json,
    wait_for,
)
from replayq.demo.investigate import Investigation
from replayq.demo.repair import Repair

INTRO = """\
replayq demo: the ShipOrder incident of seed 003, on real local services.

A shop ships orders through a warehouse HTTP API. ship_order v1 has the seed's
mistakes: a 0.5s lease never extended, a lock per job type, an effect key that
contains the attempt, retries on every error, a status cache written with an old
version, dedup on a payload hash that includes a timestamp. The warehouse slows
down; we watch what happens, then investigate with the runbook (docs/runbook.md),
printing each command before running it. Times are scaled down: the seed's
45 s warehouse call against a 30 s visibility timeout becomes 3 s against 0.5 s."""


class Story(Investigation, Repair):
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
                and all_settled(self.app)
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
            lambda: job_events(app, job_id, "lease.expired"), timeout=15, what="the lease expiry"
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
        leased = job_events(app, job_id, "job.leased")
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
            lambda: job_events(app, job_id, "job.write_rejected"),
            timeout=20,
            what="the first attempt to come back",
        )
        first = result.workers_by_attempt.get(1, "?")
        self.say(
            f"{demo.clock()} {first} came back from the slow call after its lease was gone: "
            "it wrote the order again; its ack was rejected"
        )
        wait_for(lambda: all_settled(app), timeout=20, what="every job to settle")
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
            f"    status page (cache order_status:{INCIDENT_ORDER}): "
            f"{entry_status(cached)} -> {verdict}"
        )
        self.say(
            f"    {len(invoices)} send_invoice_email jobs, {result.emails_v1} email sent "
            "(that job has a business key: the second was deduplicated)"
        )
