"""Helpers for the replay-engine tests (``tests/conformance/test_replay_*.py``).

The job under test is ``tests.apps.replay_shop`` (``ship_order`` v1/v2/v3), whose
handlers talk to the real HTTP service of ``tests/services.py``. ``cli`` runs the
real ``replayq`` console script as a subprocess, so the CLI path is exercised as
a user runs it, with the service's address in its environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from msgspec import structs

import replayq
from replayq.model import JobState, TraceEvent
from replayq.storage.context_params import LineageQuery
from replayq.storage.protocol import TraceQuery, idem_get
from replayq.testing import run_inline
from tests.apps import replay_shop

ROOT = Path(__file__).resolve().parents[1]
REPLAYQ = str(Path(sys.executable).with_name("replayq"))
APP_SPEC = "tests.apps.replay_shop:app"


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``replayq --db URL ARGS...`` in a subprocess (cwd: the repository, for ``--app``)."""
    return subprocess.run(
        [REPLAYQ, "--db", url, *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli_ok(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = cli(url, *args)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def record(app: replayq.App, order_id: int = 1, **payload: Any) -> replayq.Job:
    """Seed ``order:<order_id>`` (unless it exists) and run ``ship_order`` v1 to success."""
    if not app.state.get("order", order_id).exists:
        replay_shop.seed_order(app, order_id)
    job = run_inline(app, "ship_order", {"order_id": order_id, **payload})
    assert job.state == JobState.SUCCEEDED, job.last_error
    return job


def record_dead(app: replayq.App, order_id: int = 1) -> replayq.Job:
    """A ``ship_order`` whose shipment was created but whose email failed: the job is dead.

    The caller has told the service to fail the next ``/email`` request.
    """
    replay_shop.seed_order(app, order_id)
    job = run_inline(app, "ship_order", {"order_id": order_id})
    assert job.state == JobState.DEAD, job.state
    return job


def derived_events(app: replayq.App, trace_id: str) -> list[TraceEvent]:
    """The events of a replay, fork or rerun trace."""
    with app.storage.transaction(readonly=True) as tx:
        return tx.trace_query(TraceQuery(trace_id=trace_id))


def lineage(app: replayq.App, trace_id: str) -> dict[str, Any]:
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.lineage_list(LineageQuery(trace_id=trace_id))
    assert rows, f"no lineage row for {trace_id}"
    return structs.asdict(rows[0])


def lineage_of_job(app: replayq.App, job: replayq.Job) -> list[dict[str, Any]]:
    with app.storage.transaction(readonly=True) as tx:
        return [
            structs.asdict(row)
            for row in tx.lineage_list(LineageQuery(source_trace_id=job.trace_id))
        ]


def idempotency_status(app: replayq.App, key: str) -> str:
    with app.storage.transaction(readonly=True) as tx:
        row = idem_get(tx, key)
    assert row is not None, f"no idempotency record for {key!r}"
    return row.status
