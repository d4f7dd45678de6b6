"""docs/rollout.md's routing commands as written: without ``--app``, from the contracts
and the active version a worker stored (click's runner over a real database, both
backends)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

import replayq
from replayq.cli import main


def declared(app: replayq.App) -> replayq.App:
    """``price`` v1 live and v2 a candidate, as docs/rollout.md declares them."""

    @app.job("price", version="v1", retry=replayq.Retry(on=("transient",)))
    def price_v1(ctx: replayq.Context, sku: str, qty: int) -> dict[str, int]:
        return {"amount": qty}

    @app.job("price", version="v2", retry=replayq.Retry(on=("transient",)), candidate=True)
    def price_v2(ctx: replayq.Context, sku: str, qty: int) -> dict[str, int]:
        return {"amount": qty}

    return app


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
    declared(app_factory()).register_contracts()  # what a worker does when it starts

    done = cli(db_url, "rollout", *first)

    assert done.exit_code == 0, done.output
    assert "price  revision 1  baseline v1" in done.output
    history = cli(db_url, "rollout", "history", "price")
    assert history.exit_code == 0, history.output
    assert "r1 " in history.output and first[0] in history.output


def test_start_without_app_names_the_versions_a_worker_stored(
    db_url: str, app_factory: Callable[..., replayq.App]
) -> None:
    declared(app_factory()).register_contracts()

    done = cli(db_url, "rollout", "start", "price", "--to", "v9")

    assert done.exit_code == 2
    assert "price has no version 'v9' (declared: v1, v2)" in done.output
    started = cli(db_url, "rollout", "start", "price", "--to", "v2", "--canary", "50%")
    assert started.exit_code == 0, started.output
    assert "v2           50.0% of new jobs" in started.output
