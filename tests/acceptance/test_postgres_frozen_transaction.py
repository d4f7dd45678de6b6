"""A worker frozen inside a transaction is ended by ``idle_in_transaction_timeout``:
its row locks go, the other workers go on, and when it thaws nothing runs twice.

Worker ``w1`` (``?idle_in_transaction_timeout=1``) is held inside the commit
transaction of job ``HELD``'s step, after that transaction has locked the one row every
job's commit updates (``tests/apps/frozen_tx.py``), and is then SIGSTOPped. The server
must end that session (it leaves ``pg_stat_activity``) and so release the lock: worker
``w2`` (default timeout) must finish jobs while ``w1`` is still frozen. Once ``w1`` is
resumed its next statement meets the ended session; the job is put back
(``storage_fault``), not failed, and runs again: its effect is not repeated
(deduplicated by its record), its step's writes are applied once, and ``w1`` drains on.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests import chaos_check
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for, workers_ended
from tests.apps import frozen_tx
from tests.conftest import PG_URL
from tests.services import Service

pytestmark = pytest.mark.postgres

JOBS = 40
HELD = 3
TIMEOUT = 1.0  # w1's idle_in_transaction_timeout, seconds
# How long past the timeout w2 may wait for the frozen worker's lock on a loaded machine.
SLACK = 6.0


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def test_a_worker_frozen_inside_a_transaction_is_ended_and_nothing_runs_twice(
    pg_schema_url: str, tmp_path: Path, effects_service: Service, request: pytest.FixtureRequest
) -> None:
    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    for statement in frozen_tx.TABLES:
        _rows(pg_schema_url, statement)
    app = frozen_tx.build(pg_schema_url)
    sink = tmp_path / "effects.jsonl"
    for n in range(JOBS):
        app.enqueue("pack", {"n": n, "sink": str(sink)})
    hold = tmp_path / "hold"
    hold.touch()
    entered = Path(f"{hold}.entered")
    env = {"FROZEN_TX_HOLD": str(hold), "FROZEN_TX_HOLD_JOB": str(HELD)}
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    frozen_url = f"{pg_schema_url}&idle_in_transaction_timeout={TIMEOUT:g}"
    w1 = WorkerLauncher(frozen_url, tmp_path, launcher.started).start(
        "w1", app="tests.apps.frozen_tx:app", env={**env, "FROZEN_TX_WORKER": "w1"}
    )

    def succeeded_by(worker_id: str) -> int:
        return sum(
            1
            for j in app.list_jobs(limit=1000)
            if j.state.value == "succeeded"
            for e in app.trace(j.id)
            if e.name == "job.succeeded" and e.worker_id == worker_id
        )

    with closing(app), workers_ended(request, launcher):
        # w1 alone until it holds job HELD inside its commit: it took jobs 0..HELD.
        wait_for(entered.exists, timeout=60, what="w1 to hold job HELD inside its commit")
        w1.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        hold.unlink()  # when it thaws, it goes straight on with that transaction
        backend_pid = int(entered.read_text())
        w2 = launcher.start("w2", app="tests.apps.frozen_tx:app", env={"FROZEN_TX_WORKER": "w2"})
        wait_for(
            lambda: (
                not _rows(PG_URL, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend_pid,))
            ),
            timeout=TIMEOUT + SLACK,
            what="the server to end the frozen worker's session",
        )
        ended_after = time.monotonic() - frozen_at
        # w2's jobs each need the row lock the frozen session held: they go on without w1.
        wait_for(
            lambda: succeeded_by("w2") >= 3,
            timeout=TIMEOUT + SLACK + 10,
            what="w2 to finish jobs while w1 is frozen",
        )
        w2_went_on_after = time.monotonic() - frozen_at
        assert w1.proc.poll() is None and w1.stopped
        w1.signal(signal.SIGCONT)

        def all_succeeded() -> bool:
            return all(j.state.value == "succeeded" for j in app.list_jobs(limit=1000))

        wait_for(all_succeeded, timeout=60, what="every job to succeed")
        print(
            f"\nfrozen session ended {ended_after:.1f}s after SIGSTOP; "
            f"w2 had finished 3 jobs {w2_went_on_after:.1f}s after it"
        )
        chaos_check.assert_clean(
            "PostgreSQL, a worker frozen inside a transaction past idle_in_transaction_timeout",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS,
            sink=sink,
        )
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert sorted(effects) == list(range(JOBS)) and max(effects.values()) == 1
        packed = Counter(n for (n,) in _rows(pg_schema_url, "SELECT n FROM frozen_packed"))
        assert packed == Counter(range(JOBS)), "each job's step writes applied once"
        assert _rows(pg_schema_url, "SELECT packed FROM frozen_totals") == [(JOBS,)]

        held = next(j for j in app.list_jobs(limit=1000) if j.payload["n"] == HELD)
        names = Counter(e.name for e in app.trace(held.id))
        assert names["job.succeeded"] == 1 and names["job.failed"] == 0, names
        released = [e for e in app.trace(held.id) if e.name == "lease.released"]
        assert released and "storage_fault" in released[0].data, "put back, not failed"
        assert names["effect.succeeded"] == 1, "the effect ran in the frozen attempt only"
        assert names["effect.deduplicated"] == 1, "and was found done when the job ran again"
        # w1 survived and drains on its own after it thawed.
        assert w1.proc.poll() is None, w1.log()
        w2.kill()
        before = succeeded_by("w1")
        for n in range(JOBS, JOBS + 3):
            app.enqueue("pack", {"n": n, "sink": str(sink)})
        wait_for(lambda: succeeded_by("w1") == before + 3, timeout=60, what="w1 to drain on")
        for worker in launcher.started:
            assert "Traceback" not in worker.log(), worker.log()
