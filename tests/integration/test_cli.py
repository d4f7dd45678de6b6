"""The ``replayq`` command line over a real SQLite file (click's runner, no subprocess)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import replayq
from replayq.cli import main


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture
def app(url: str) -> Iterator[replayq.App]:
    app = replayq.App(url)

    @app.job("ship", lease="30s")
    def ship(ctx: replayq.Context, order_id: int) -> dict[str, int]:
        if order_id < 0:
            raise replayq.ValidationError(f"order {order_id} does not exist")
        return {"shipment": order_id * 10}

    yield app
    app.close()


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, *args])


def ok(url: str, *args: str) -> Result:
    result = cli(url, *args)
    assert result.exit_code == 0, result.output
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def run_all(app: replayq.App) -> None:
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()


# -- enqueue and jobs -------------------------------------------------------------------------


def test_enqueue_prints_the_job_id_and_rejects_bad_json(url: str, app: replayq.App) -> None:
    app.register_contracts()  # what a worker does when it starts
    job_id = int(ok(url, "enqueue", "ship", "--payload", '{"order_id": 5}').stdout)
    assert app.get_job(job_id).payload == {"order_id": 5}

    broken = cli(url, "enqueue", "ship", "--payload", "{order_id: 5")
    assert broken.exit_code == 2
    assert "--payload is not valid JSON" in broken.output
    assert len(app.list_jobs()) == 1


def test_jobs_list_json_shows_every_job_with_its_state(url: str, app: replayq.App) -> None:
    done = app.enqueue("ship", {"order_id": 1})
    run_all(app)
    waiting = app.enqueue("ship", {"order_id": 2}, message_id="evt-2")

    listed = as_json(ok(url, "jobs", "list", "--json"))
    assert {(j["id"], j["state"]) for j in listed} == {(done, "succeeded"), (waiting, "queued")}
    [row] = [j for j in listed if j["id"] == waiting]
    assert row["message_id"] == "evt-2"
    assert row["payload"] == {"order_id": 2}

    only_queued = as_json(ok(url, "jobs", "list", "--state", "queued", "--json"))
    assert [j["id"] for j in only_queued] == [waiting]
    assert as_json(ok(url, "jobs", "list", "--type", "other", "--json")) == []
    assert "succeeded" in ok(url, "jobs", "list").stdout


def test_jobs_show_prints_the_job_and_fails_clearly_for_a_missing_one(
    url: str, app: replayq.App
) -> None:
    job_id = app.enqueue("ship", {"order_id": 3})
    run_all(app)

    shown = ok(url, "jobs", "show", str(job_id)).stdout
    assert "succeeded" in shown
    assert "{'shipment': 30}" in shown
    assert as_json(ok(url, "jobs", "show", str(job_id), "--json"))["result"] == {"shipment": 30}

    missing = cli(url, "jobs", "show", "999")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: no job with id 999"


def test_jobs_cancel_cancels_only_queued_or_running_jobs(url: str, app: replayq.App) -> None:
    job_id = app.enqueue("ship", {"order_id": 3})
    assert "cancelled" in ok(url, "jobs", "cancel", str(job_id)).stdout
    assert app.get_job(job_id).state is replayq.JobState.CANCELLED
    again = cli(url, "jobs", "cancel", str(job_id))
    assert again.exit_code == 2
    assert again.stderr.startswith("error: ") and "neither queued nor running" in again.stderr


# -- dead jobs --------------------------------------------------------------------------------


def test_dead_list_shows_the_reason_and_requeue_needs_one(url: str, app: replayq.App) -> None:
    dead_id = app.enqueue("ship", {"order_id": -1})
    alive_id = app.enqueue("ship", {"order_id": 1})
    run_all(app)

    listed = as_json(ok(url, "dead", "list", "--json"))
    assert [(j["id"], j["dead_reason"]) for j in listed] == [(dead_id, "not_retryable")]
    assert "not_retryable" in ok(url, "dead", "list").stdout

    no_reason = cli(url, "dead", "requeue", str(dead_id))
    assert no_reason.exit_code == 2
    assert "--reason" in no_reason.output

    ok(url, "dead", "requeue", str(dead_id), "--reason", "order -1 was restored")
    assert app.get_job(dead_id).state is replayq.JobState.QUEUED
    [requeued] = [e for e in app.trace(dead_id) if e.name == "job.requeued"]
    assert requeued.data["reason"] == "order -1 was restored"
    not_dead = cli(url, "dead", "requeue", str(alive_id), "--reason", "x")
    assert not_dead.exit_code == 2
    assert not_dead.stderr.strip() == f"error: job {alive_id} is not dead"


# -- trace and stats --------------------------------------------------------------------------


def test_trace_show_prints_a_timeline_in_order(url: str, app: replayq.App) -> None:
    job_id = app.enqueue("ship", {"order_id": 4})
    run_all(app)

    lines = ok(url, "trace", "show", str(job_id)).stdout.splitlines()
    names = ["job.enqueued", "job.leased", "job.succeeded"]
    positions = [next(i for i, line in enumerate(lines) if name in line) for name in names]
    assert positions == sorted(positions)
    assert "(cli-test)" in lines[positions[1]], "the timeline names the worker"

    events = as_json(ok(url, "trace", "show", str(job_id), "--json"))
    assert [e["name"] for e in events] == names
    assert {e["trace_id"] for e in events} == {app.get_job(job_id).trace_id}
    assert [e["hlc"] for e in events] == sorted(e["hlc"] for e in events)

    assert cli(url, "trace", "show", "999").exit_code == 2


def test_stats_counts_jobs_per_type_and_state(url: str, app: replayq.App) -> None:
    app.enqueue("ship", {"order_id": -1})
    app.enqueue("ship", {"order_id": 1})
    run_all(app)
    app.enqueue("ship", {"order_id": 2})
    app.enqueue("ship", {"order_id": 3})

    rows = as_json(ok(url, "stats", "--json"))
    counts = {(r["job_type"], r["state"]): r["count"] for r in rows}
    assert counts == {("ship", "dead"): 1, ("ship", "succeeded"): 1, ("ship", "queued"): 2}
    table = ok(url, "stats").stdout
    assert "queued" in table and "dead" in table


# -- contracts --------------------------------------------------------------------------------


def declare_ship(app: replayq.App, version: str, **contract: Any) -> None:
    def ship(ctx: replayq.Context, order_id: int) -> None: ...

    app.job("ship", version=version, **contract)(ship)


def test_contract_show_lists_each_stored_version(url: str) -> None:
    app = replayq.App(url)
    declare_ship(app, "v1", lease="30s")
    declare_ship(app, "v2", lease="1m")
    app.register_contracts()
    app.close()

    shown = as_json(ok(url, "contract", "show", "ship", "--json"))
    assert {v: c["lease"] for v, c in shown.items()} == {"v1": 30.0, "v2": 60.0}
    assert "lease" in ok(url, "contract", "show", "ship").stdout
    unknown = cli(url, "contract", "show", "nothing")
    assert unknown.exit_code == 2 and unknown.stderr.startswith("error: no stored contract")


def test_contract_diff_exits_1_listing_every_difference(url: str) -> None:
    app = replayq.App(url)
    declare_ship(app, "v1", lease="30s", retry=replayq.Retry(max_attempts=5))
    declare_ship(
        app,
        "v2",
        lease="1m",
        retry=replayq.Retry(max_attempts=3, on=("transient",)),
        ordering="order:{order_id}",
    )
    declare_ship(app, "v3", lease="30s", retry=replayq.Retry(max_attempts=5))
    app.register_contracts()
    app.close()

    changed = cli(url, "contract", "diff", "ship", "v1", "v2", "--json")
    assert changed.exit_code == 1
    fields = {c["field"] for c in json.loads(changed.stdout)}
    assert {"lease", "retry.max_attempts", "retry.on", "ordering"} <= fields
    readable = cli(url, "contract", "diff", "ship", "v1", "v2").stdout
    assert "lease / visibility timeout" in readable and "ordering" in readable

    same = cli(url, "contract", "diff", "ship", "v1", "v3")
    assert same.exit_code == 0
    assert "same contract" in same.stdout
    no_version = cli(url, "contract", "diff", "ship", "v1", "v9")
    assert no_version.exit_code == 2
    assert no_version.stderr.strip() == "error: ship has no stored version 'v9'"


def test_changed_contract_under_the_same_version_is_refused(url: str) -> None:
    first = replayq.App(url)
    declare_ship(first, "v1", lease="30s")
    first.register_contracts()
    first.close()
    second = replayq.App(url)
    declare_ship(second, "v1", lease="45s")
    with pytest.raises(replayq.ContractError, match="declare a new version"):
        second.register_contracts()
    second.close()


def test_contract_lint_flags_lease_below_observed_p99_and_effects_without_key(url: str) -> None:
    app = replayq.App(url)

    @app.job("slow", lease="0.2s", heartbeat="0.05s")
    def slow(ctx: replayq.Context) -> None:
        time.sleep(0.3)

    @app.job("notify", effects=("email.send",))
    def notify(ctx: replayq.Context, user_id: int) -> None: ...

    @app.job("fine", idempotency="fine:{n}", effects=("email.send",))
    def fine(ctx: replayq.Context, n: int) -> None: ...

    app.register_contracts()
    app.enqueue("slow", {})
    worker = replayq.Worker(app, worker_id="lint")
    for job in worker.lease(1):
        worker.execute(job)
    app.close()

    result = cli(url, "contract", "lint", "--json")
    assert result.exit_code == 1
    found = {(f["job_type"], f["rule"]) for f in json.loads(result.stdout)}
    assert found == {("slow", "lease-below-p99"), ("notify", "effects-without-idempotency-key")}
    assert cli(url, "contract", "lint", "fine").exit_code == 0


def test_contract_lint_of_a_type_or_database_without_contracts_is_not_no_findings(
    url: str,
) -> None:
    """Before: "no findings", exit 0, for a misspelled type and for a database no worker
    has stored contracts in: a lint gate passed having linted nothing."""
    nothing = cli(url, "contract", "lint")
    assert nothing.exit_code == 2 and "no stored contract to lint" in nothing.output

    app = replayq.App(url)

    @app.job("slow", lease="0.2s")
    def slow(ctx: replayq.Context) -> None: ...

    app.register_contracts()
    app.close()
    misspelled = cli(url, "contract", "lint", "slwo")
    assert misspelled.exit_code == 2, misspelled.output
    assert "no stored contract for 'slwo'" in misspelled.output
    assert "no findings" not in misspelled.output
    assert cli(url, "contract", "lint", "slow").exit_code == 0


def test_contract_lint_names_a_candidate_version_never_run_as_unchecked(url: str) -> None:
    """Before: v2, a candidate with the same too-short lease as v1, was silently skipped:
    the output named only v1, and `contract lint` of a v2 alone said "no findings"."""
    app = replayq.App(url)

    @app.job("slow", version="v1", lease="0.2s", heartbeat="0.05s")
    def slow_v1(ctx: replayq.Context) -> None:
        time.sleep(0.3)

    @app.job("slow", version="v2", lease="0.2s", heartbeat="0.05s", candidate=True)
    def slow_v2(ctx: replayq.Context) -> None:
        time.sleep(0.3)

    app.register_contracts()
    app.enqueue("slow", {})
    worker = replayq.Worker(app, worker_id="lint")
    for job in worker.lease(1):
        worker.execute(job)
    app.close()

    result = cli(url, "contract", "lint", "slow")
    assert result.exit_code == 1
    assert "slow v1: lease-below-p99: lease 0.2s" in result.output
    assert (
        "slow v2: unchecked lease-below-p99: no production attempt of slow v2 has a recorded "
        "outcome (workers run v1 for new jobs; this version is not active)"
    ) in result.output
    assert "slow v1: unchecked" not in result.output
