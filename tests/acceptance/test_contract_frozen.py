"""A version's stored contract is frozen: a worker whose code changed it under the same
version refuses to start, runs nothing and stores nothing (docs/contracts.md, the
``version`` row; docs/rollout.md, "freeze the contract"). A real worker process each time."""

from __future__ import annotations

from tests.acceptance.workers import WorkerLauncher
from tests.apps import frozen_contract

APP = "tests.apps.frozen_contract:app"


def test_a_worker_with_a_changed_contract_under_a_stored_version_refuses_to_start(
    launcher: WorkerLauncher,
) -> None:
    first = launcher.start("first", app=APP, burst=True)
    assert first.wait(30) == 0, first.log()
    app = frozen_contract.build(launcher.url)
    try:
        job_id = app.enqueue("price", {"sku": "a"})
        changed = launcher.start("changed", app=APP, burst=True, env={"PRICE_LEASE": "10s"})
        assert changed.wait(30) == 2, changed.log()
        assert (
            "the contract of price v1 differs from the one stored; contracts are frozen per "
            "version: declare a new version (see: replayq contract diff price)"
        ) in changed.log()
        assert app.get_job(job_id).state.value == "queued", "it ran nothing"
        [stored] = app.contracts("price")
        assert stored.lease == 30.0, "the stored contract is unchanged"

        same = launcher.start("same", app=APP, burst=True)
        assert same.wait(30) == 0, same.log()
        assert app.get_job(job_id).state.value == "succeeded"
    finally:
        app.close()
