"""Runbook steps 1 to 6 in the demo: identify, quarantine, classify, dry-run, fork, compare."""

from __future__ import annotations

import re
from collections import Counter

from replayq import App, StateStore, diff_traces
from replayq.demo.chapter import Chapter
from replayq.demo.harness import (
    APP_SPEC,
    INCIDENT_ORDER,
    DemoError,
)


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


def fork_cache_consistent(app: App, branch: str, order_id: int) -> tuple[bool, str]:
    """Whether the fork's status cache entry carries the version of the fork's order."""
    order = StateStore(app, branch).get("order", order_id)
    entry = app.cache_backend.latest(f"{branch}:order_status:{order_id}", app.clock.now())
    cached = f"{entry.value.get('status')!r} @v{entry.version}" if entry else "(no entry)"
    text = f"fork's order @v{order.version}, fork's status cache {cached}"
    return entry is not None and entry.version == order.version, text


class Investigation(Chapter):
    """Chapters 2 to 7: what happened, found with the runbook's commands."""

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
