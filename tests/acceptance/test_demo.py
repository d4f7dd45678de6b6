"""``replayq demo`` reproduces the ShipOrder incident on real services; its facts are asserted.

The demo starts three HTTP services and ``replayq worker`` subprocesses; every
fact below comes from a service's ``/_counts`` or from the database, as
returned in ``DemoResult`` (in-process) or printed (the CLI).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from replayq.demo import DemoResult, run_demo
from replayq.testing import assert_replays, replay_case
from tests.acceptance.workers import REPLAYQ, ROOT

NO_REQUESTS = {"warehouse": 0, "payment": 0, "email": 0}


def assert_incident_reproduced_investigated_and_fixed(result: DemoResult) -> None:
    # The incident, at the real warehouse: one order, two shipments.
    assert result.shipments_v1 == 2, "v1 shipped order 1001 twice at the warehouse service"
    assert result.emails_v1 == 1, "the invoice job's business key absorbed the duplicate"
    assert result.resent_job_id != result.job_id, "the re-sent event was not deduplicated"
    assert result.cache_stale_before, "the status cache disagreed with the order"

    # The resource timeline: both workers on order 1001, the lease expiry between them.
    assert len(set(result.workers_by_attempt.values())) == 2
    assert sorted(result.resource_workers) == sorted(result.workers_by_attempt.values())
    assert result.lease_expired_between

    # The contract lint names the two mistakes the incident needed.
    assert "lease-below-p99" in result.lint_rules
    assert "effects-without-idempotency-key" in result.lint_rules

    # Dry-run and fork: zero requests to any real service.
    assert result.dry_run_requests == NO_REQUESTS
    assert result.fork_requests == NO_REQUESTS

    # The fork onto v2 intends one shipment where v1 made two, and its cache matches its state.
    assert result.original_shipments_intended == 2
    assert result.fork_shipments_intended == 1
    assert result.fork_cache_consistent

    # The late attempt's writes were refused by fencing: nothing of it to roll back, the
    # order keeps attempt 2's one shipment, and the refreshed cache is consistent.
    assert result.late_writes_fenced == [
        "effect result warehouse.create_shipment ship_order:1001:attempt-1"
    ]
    assert result.rollback_would_restore == []
    assert result.order_after_repair["status"] == "shipped"
    assert len(result.order_after_repair["shipments"]) == 1
    assert result.cache_after_repair == (
        {"status": "shipped"},
        result.order_version_after_repair,
    )
    assert result.cache_consistent_after_repair

    # v2 deployed under the same slow warehouse: one shipment, no re-delivery.
    assert result.shipments_v2 == 1
    assert result.v2_redeliveries == 0
    assert result.resend_deduplicated
    assert result.v2_cache_consistent

    assert result.regression_v2_passes
    assert result.regression_v1_divergence and "diverges" in result.regression_v1_divergence


def assert_cleaned_up(result: DemoResult) -> None:
    assert result.kept is None
    assert not Path(result.folder).exists(), "the demo's temporary folder is removed"
    for pid in result.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.fixture(scope="module")
def sqlite_demo() -> tuple[DemoResult, str]:
    """One in-process run on a temporary SQLite file: its facts and what it printed."""
    out = io.StringIO()
    return run_demo(None, False, out=out), out.getvalue()


def test_demo_in_process_on_sqlite_establishes_every_fact(
    sqlite_demo: tuple[DemoResult, str],
) -> None:
    result, printed = sqlite_demo

    assert_incident_reproduced_investigated_and_fixed(result)
    assert_cleaned_up(result)
    assert result.seconds < 60
    assert "$ replayq trace resource order:1001 --leases" in printed
    assert "docs/runbook.md" in printed


def test_exported_regression_case_passes_on_v2_and_reports_divergence_on_v1(
    sqlite_demo: tuple[DemoResult, str], tmp_path: Path
) -> None:
    from replayq.demo.shop.app import app as shop_app

    result, _ = sqlite_demo
    case = tmp_path / "case.json"
    case.write_text(json.dumps(result.case), encoding="utf-8")

    report = assert_replays(case, shop_app, version="v2")
    assert report.outcome_now.status == "succeeded"
    with pytest.raises(AssertionError, match="diverges from the recorded case"):
        assert_replays(case, shop_app, version="v1")
    diverged = replay_case(case, shop_app, version="v1")
    assert diverged.first_divergence is not None
    assert diverged.first_divergence.step == "load_order"


def test_demo_command_exits_zero_and_prints_its_facts() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REPLAYQ_DB"}
    done = subprocess.run(
        [REPLAYQ, "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    out = done.stdout

    def row(label: str) -> str:
        match = re.search(rf"^  {re.escape(label)}\s+(.+)$", out, re.MULTILINE)
        assert match, f"summary row {label!r} missing"
        return match.group(1).strip()

    assert row("shipments made by v1 (warehouse, order 1001)") == "2"
    assert row("shipments intended by the v2 fork") == "1"
    assert row("real requests during the dry-run and the fork") == "0"
    assert row("regression case vs v2 / vs v1") == "passes / diverges"
    # In the printed resource timeline, the lease expiry sits between the two attempts.
    block = out.split("$ replayq trace resource order:1001 --leases", 1)[1].split("\n\n", 1)[0]
    job = re.search(r"order service: ship order 1001 -> job (\d+)", out)
    assert job
    lines = [line for line in block.splitlines() if f"job {job.group(1)} " in line]
    names = [
        (m.group(1), m.group(2)) for m in (re.search(r"#(\d)\s+(\S+)", ln) for ln in lines) if m
    ]
    first_read_1 = names.index(("1", "state.read"))
    expiry = names.index(("1", "lease.expired"))
    first_read_2 = names.index(("2", "state.read"))
    assert first_read_1 < expiry < first_read_2


@pytest.mark.postgres
def test_demo_on_postgres_establishes_every_fact(pg_schema_url: str) -> None:
    result = run_demo(pg_schema_url, False, out=io.StringIO())

    assert_incident_reproduced_investigated_and_fixed(result)
    assert_cleaned_up(result)
