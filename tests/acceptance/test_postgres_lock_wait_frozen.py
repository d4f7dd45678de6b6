"""``ctx.lock(wait=...)`` keeps its wait while a worker is frozen inside a commit that
writes under the lock (PostgreSQL).

Worker ``w1`` runs ``hold`` (``tests/apps/lock_freeze.py``): under ``shelf:1`` it writes
``shelf/1`` in a step, and stops itself (SIGSTOP, ``tests/apps/pipeline_freeze.py``'s hook)
inside that step's one-round-trip commit, its statements sent and ``COMMIT`` not: the
write's fence holds the lock's row ``FOR SHARE`` until it thaws or its session ends. Worker
``w2`` then runs ``take``, which asks the same lock with ``wait=1s``. Before, its
acquisition (the upsert on that row) waited inside the server past its wait, for as long
as ``w1`` stayed frozen. Now each try waits at most what is left of the wait
(``lock_timeout``), 55P03 reads as "not granted yet", and ``take`` gets its
``LockTimeoutError`` (``lock.timeout``) after about a second; its sessions are not left
inside a transaction, and it goes on working. Thawed, ``w1``'s commit lands under its
token (nobody took the lock meanwhile), and ``take``'s retry then takes the lock with
the next token and writes after it: the entity's versions in fencing order.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

import replayq
from replayq.model import TERMINAL_STATES
from replayq.storage.protocol import lock_get
from tests.acceptance.workers import WorkerLauncher, wait_for, workers_ended
from tests.apps import lock_freeze

pytestmark = pytest.mark.postgres

APP = "tests.apps.lock_freeze:app"
WAIT = 1.0
MARGIN = 1.5  # what the not-acquired outcome may take past ``WAIT`` on a loaded machine
W2_NAME = "lockwait-w2"


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture
def app(pg_schema_url: str) -> Iterator[replayq.App]:
    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    with closing(lock_freeze.build(pg_schema_url)) as built:
        yield built


def test_a_lock_wait_is_kept_while_its_holder_is_frozen_in_a_commit(
    app: replayq.App, pg_schema_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    held = app.enqueue("hold", {"n": 1})
    mark = tmp_path / "frozen.json"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    w1 = launcher.start(
        "w1",
        app=APP,
        env={"PIPELINE_FREEZE_JOB": "1", "PIPELINE_FREEZE_MARK": str(mark)},
    )
    with workers_ended(request, launcher):
        wait_for(mark.exists, timeout=60, what="w1 to stop itself inside its step commit")
        w1.wait_stopped()
        # The premise: the lock's row is held by the frozen commit (its fence, FOR SHARE).
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _rows(
                pg_schema_url,
                "SELECT 1 FROM rq_locks WHERE resource = %s FOR UPDATE NOWAIT",
                (lock_freeze.SHELF,),
            )

        taken = app.enqueue("take", {"wait": WAIT})
        w2_url = f"{pg_schema_url}&application_name={W2_NAME}"
        WorkerLauncher(w2_url, tmp_path, launcher.started).start("w2", app=APP)

        def timed_out() -> replayq.TraceEvent | None:
            return next((e for e in app.trace(taken) if e.name == "lock.timeout"), None)

        timeout = wait_for(timed_out, timeout=30, what="take's lock.timeout while w1 is frozen")
        assert WAIT <= timeout.data["wait"] < WAIT + MARGIN, timeout.data
        assert timeout.data["holder"] == "w1", timeout.data
        failed = next(e for e in app.trace(taken) if e.name == "job.failed")
        assert "LockTimeoutError" in failed.data["error"], failed.data

        # No session of w2's left inside a transaction (a connection poisoned, or a pool
        # connection that never came back), while w1 is still frozen and take retries.
        time.sleep(WAIT)
        sessions = _rows(
            pg_schema_url,
            "SELECT state FROM pg_stat_activity WHERE application_name = %s",
            (W2_NAME,),
        )
        assert sessions, "w2's sessions are seen"
        assert all(state in ("idle", "active") for (state,) in sessions), sessions
        with app.storage.transaction(readonly=True) as tx:
            row = lock_get(tx, lock_freeze.SHELF)
        assert row is not None and row.job_id == held, row

        w1.signal(signal.SIGCONT)

        def settled(job_id: int) -> replayq.Job | None:
            job = app.get_job(job_id)
            return job if job.state in TERMINAL_STATES else None

        hold_job = wait_for(lambda: settled(held), timeout=30, what="hold to settle")
        take_job = wait_for(lambda: settled(taken), timeout=60, what="take to settle")

    assert hold_job.state is replayq.JobState.SUCCEEDED, hold_job.last_error
    assert take_job.state is replayq.JobState.SUCCEEDED, take_job.last_error
    assert take_job.attempt > 1
    # hold's write landed under its token, take's after it under the next one: in the
    # order of their fencing tokens, neither refused.
    token = hold_job.result
    assert take_job.result == token + 1
    versions = _rows(
        pg_schema_url,
        "SELECT version, job_id, fencing_token FROM rq_entity_versions"
        " WHERE namespace = 'shelf' AND key = '1' ORDER BY version",
    )
    assert versions == [(1, held, token), (2, taken, token + 1)], versions
    for job_id in (held, taken):
        names = [e.name for e in app.trace(job_id)]
        assert "state.write_rejected" not in names, names
