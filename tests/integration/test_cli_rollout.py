"""docs/rollout.md's routing commands as written: without ``--app``, from the contracts
and the active version a worker stored (click's runner over a real database, both
backends)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

import replayq
from replayq.cli import main
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
