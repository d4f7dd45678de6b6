"""docs/rollout.md's routing commands as written: without ``--app``, from the contracts
and the active version a worker stored (click's runner over a real database, both
backends)."""

from __future__ import annotations

import importlib
import json
import shlex
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

import replayq
from replayq.cli import main
from tests.apps import verify_stepless
from tests.apps.rollout_cli import declare


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, *args])


@pytest.mark.parametrize(
    "first",
    [
        ("start", "price", "--to", "v2", "--canary", "5%", "--reason", "new pricing client"),
        ("pin", "price", "--field", "tenant", "--values", "acme,globex", "--to", "v2"),
        ("shadow", "price", "--version", "v2", "--fraction", "10%"),
        ("dual-run", "price", "--version", "v2"),
    ],
    ids=lambda args: args[0],
)
def test_a_first_routing_change_needs_no_app_only_the_stored_contracts(
    db_url: str, app_factory: Callable[..., replayq.App], first: tuple[str, ...]
) -> None:
    declare(app_factory()).register_contracts()  # what a worker does when it starts

    done = cli(db_url, "rollout", *first)

    assert done.exit_code == 0, done.output
    assert "price  revision 1  baseline v1" in done.output
    history = cli(db_url, "rollout", "history", "price")
    assert history.exit_code == 0, history.output
    assert "r1 " in history.output and first[0] in history.output


def test_start_without_app_names_the_versions_a_worker_stored(
    db_url: str, app_factory: Callable[..., replayq.App]
) -> None:
    declare(app_factory()).register_contracts()

    done = cli(db_url, "rollout", "start", "price", "--to", "v9")

    assert done.exit_code == 2
    assert "price has no version 'v9' (declared: v1, v2)" in done.output
    started = cli(db_url, "rollout", "start", "price", "--to", "v2", "--canary", "50%")
    assert started.exit_code == 0, started.output
    assert "v2           50.0% of new jobs" in started.output


def test_verify_prints_fork_commands_that_run_as_printed(
    db_url: str, app_factory: Callable[..., replayq.App]
) -> None:
    app = declare(app_factory())
    app.register_contracts()
    job_id = app.enqueue("price", {"sku": "sku-1", "qty": 2})
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()
    spec = "tests.apps.rollout_cli:app"

    verified = cli(
        db_url, "rollout", "verify", "price", "--app", spec, "--from", "v1", "--to", "v2"
    )

    assert verified.exit_code == 1, verified.output
    assert "cache_shape" in verified.output
    # Same steps, another value: the fork runs the whole attempt, from its first step.
    fork = f"replayq fork {job_id} --attempt 1 --version v2 --from-step quote --app {spec}"
    assert fork in verified.output, verified.output
    forked = cli(db_url, *fork.split()[1:])
    assert forked.exit_code == 0, forked.output
    assert f"fork of job {job_id} attempt 1 with v2" in forked.output


def _recorded_price_job(app_factory: Callable[..., replayq.App]) -> replayq.App:
    app = declare(app_factory())
    app.register_contracts()
    app.enqueue("price", {"sku": "sku-1", "qty": 2})
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()
    return app


@pytest.mark.parametrize(
    ("selection", "why"),
    [
        (("--from", "v9"), "no price job is recorded on version 'v9' (recorded versions: v1)"),
        (
            ("--from", "v1", "--state", "cancelled"),
            "none of the 1 price job(s) of v1 is now cancelled (they are: succeeded 1)",
        ),
    ],
    ids=["version-never-recorded", "no-job-in-that-state"],
)
def test_a_verification_that_selected_no_attempt_is_empty_and_exits_1(
    db_url: str, app_factory: Callable[..., replayq.App], selection: tuple[str, ...], why: str
) -> None:
    _recorded_price_job(app_factory)
    verify = ("rollout", "verify", "price", "--app", "tests.apps.rollout_cli:app", "--to", "v2")

    text = cli(db_url, *verify, *selection)
    as_json = cli(db_url, *verify, *selection, "--json")

    # Before: exit 0, "no differences" and "passed": true over nothing compared.
    assert text.exit_code == 1, text.output
    assert "over 0 recorded attempt(s)" in text.output and "no differences" not in text.output
    assert f"NOT VERIFIED: no recorded attempt selected, nothing verified: {why}" in text.output
    body = json.loads(as_json.output)
    assert as_json.exit_code == 1, as_json.output
    assert (body["attempts"], body["passed"], body["verdict"]) == (0, False, "empty")
    assert body["empty_reason"] == why and body["counts"] == {}


def test_a_verification_over_a_type_nothing_recorded_or_an_empty_window_is_empty(
    db_url: str, app_factory: Callable[..., replayq.App]
) -> None:
    app = declare(app_factory())
    app.register_contracts()  # as a worker's start does (and migrates); nothing recorded
    nothing = cli(
        db_url, "rollout", "verify", "price", "--app", "tests.apps.rollout_cli:app",
        "--from", "v1", "--to", "v2", "--json",
    )  # fmt: skip
    body = json.loads(nothing.output)
    assert (nothing.exit_code, body["verdict"], body["passed"]) == (1, "empty", False)
    assert body["empty_reason"] == "no job of type 'price' is recorded in this database"

    app.enqueue("price", {"sku": "sku-1", "qty": 2})
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()
    window = replayq.verify_rollout(
        app, "price", from_version="v1", to_version="v2", since=app.clock.now() + 3600
    )
    assert (window.attempts, window.verdict, window.passed) == (0, "empty", False)
    assert window.empty_reason is not None
    assert window.empty_reason.startswith("1 price job(s) of v1 are recorded, none created since")


def test_the_reason_for_an_empty_verification_reads_a_bounded_part_of_the_history(
    db_url: str, app_factory: Callable[..., replayq.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It read every job row of the type (payloads included) to name the reason: 730 MB
    # for a misspelled --from over 200,000 jobs. Now the newest few (here 3 of 4).
    from replayq.rollout import verify as verify_module

    app = declare(app_factory())
    app.register_contracts()
    for qty in range(4):
        app.enqueue("price", {"sku": "sku-1", "qty": qty + 1})
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()
    monkeypatch.setattr(verify_module, "_REASON_SCAN", 3)

    typo = replayq.verify_rollout(app, "price", from_version="v9", to_version="v2")
    assert typo.empty_reason == (
        "no price job is recorded on version 'v9' (recorded versions among its newest 3: v1)"
    )
    state = replayq.verify_rollout(
        app, "price", from_version="v1", to_version="v2", states=["cancelled"]
    )
    assert state.empty_reason == (
        "none of the 3+ price job(s) of v1 is now cancelled (they are: succeeded 3)"
    )


def test_a_verification_of_handlers_that_record_nothing_is_empty(
    db_url: str, app_factory: Callable[..., replayq.App]
) -> None:
    app = verify_stepless.declare(app_factory())
    app.enqueue("silent", {"n": 1})
    replayq.Worker(app, burst=True, worker_id="cli-test", poll_interval=0.01).run()

    verified = cli(
        db_url, "rollout", "verify", "silent", "--app", "tests.apps.verify_stepless:app",
        "--from", "v1", "--to", "v2",
    )  # fmt: skip

    assert verified.exit_code == 1, verified.output
    assert "no attempt that ran v1 recorded a ctx step or call" in verified.output


@pytest.mark.parametrize(
    ("module", "job_type", "payloads", "printed"),
    [
        # A step that makes no ctx call: its name is only in step.started (before: STEP).
        ("verify_resume", "score", [{"n": n} for n in range(1, 6)], "--from-step check"),
        # No step at all: nothing to fork from, the attempt's dry-run reproduces it.
        ("verify_stepless", "tally", [{"n": 1}], "--mode dry-run --attempt 1"),
    ],
    ids=["step-without-ctx-call", "no-step"],
)
def test_every_printed_fork_command_runs_as_printed(
    db_url: str,
    app_factory: Callable[..., replayq.App],
    module: str,
    job_type: str,
    payloads: list[dict[str, int]],
    printed: str,
) -> None:
    app_factory().storage  # noqa: B018 - opening it migrates the test's database
    spec = f"tests.apps.{module}:app"
    built = importlib.import_module(f"tests.apps.{module}")
    recorded = (
        built.build(db_url) if hasattr(built, "build") else built.declare(replayq.App(db_url))
    )
    try:
        for payload in payloads:
            recorded.enqueue(job_type, payload)
        replayq.Worker(recorded, burst=True, worker_id="cli-test", poll_interval=0.01).run()
    finally:
        recorded.close()

    verified = cli(
        db_url, "rollout", "verify", job_type, "--app", spec, "--from", "v1", "--to", "v2"
    )

    assert verified.exit_code == 1, verified.output
    commands = [
        line.strip() for line in verified.output.splitlines() if line.startswith("    replayq ")
    ]
    assert commands and all(printed in c for c in commands), verified.output
    for command in commands:
        ran = cli(db_url, *shlex.split(command)[1:])
        # fork exits 0; a dry-run exits 1 as the attempt diverges; 2 was "no step 'STEP'".
        assert ran.exit_code in (0, 1) and "error:" not in ran.output, (command, ran.output)
        assert f"of job {command.split()[2]} attempt 1 with v2" in ran.output, ran.output
