"""A worker frozen inside a pipelined commit, after its statements and before their
``Sync``: its job stays locked past its lease, and it commits once, or not at all.

Worker ``w1`` (``?idle_in_transaction_timeout=1``) stops itself (SIGSTOP) in job
``HELD``'s step commit, a one-round-trip commit (``commit_at_once``): ``BEGIN``, the step's
entity write and its fenced trace append (the job row ``FOR SHARE``) are sent and flushed,
``COMMIT`` and the ``Sync`` are not (``tests/apps/pipeline_freeze.py``). ``w2`` is then
started. While ``w1`` is frozen:

* its session stays ``active``, waiting on ``ClientRead``: the server arms
  ``idle_in_transaction_session_timeout`` only at a ``Sync``, so the session outlives that
  timeout three times over;
* the job's lease runs out (by the server's clock), and the job stays ``w1``'s: its row is
  locked (``FOR UPDATE NOWAIT`` is refused) and the reaper's own query (``LeasesExpired``,
  ``SKIP LOCKED``) does not return it, while ``w2`` finishes every other job, those ``w1``
  had leased ahead reaped after their leases.

Then either ending:

* **thawed** (SIGCONT): ``COMMIT`` goes out and commits; the step's events and its entity
  write are attempt 1's. Its lease has run out, so the first reaper to look (``w1``'s
  own or ``w2``'s) usually takes the job back and ``w1``'s ack is refused
  (``job.write_rejected``); attempt 2 finds the step's writes done (``state.unchanged``,
  ``effect.deduplicated``). If ``w1``'s heartbeat renews the lease first, ``w1`` finishes
  the job itself. Either way the entity has one version, the effect ran once, and the job
  succeeded once.
* **killed** (SIGKILL while stopped): the kernel closes the socket and the server ends the
  session at once, rolling the transaction back: attempt 1 has no step events and wrote no
  version. ``w2`` reaps the job and runs it again: the effect (claimed and recorded in
  committed transactions of their own before the freeze) is deduplicated, the entity
  written once, by attempt 2.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import replayq
from replayq.storage.params import LeasesExpired
from tests import chaos_check
from tests.acceptance.workers import (
    WorkerLauncher,
    WorkerProcess,
    read_lines,
    wait_for,
    workers_ended,
)
from tests.apps import pipeline_freeze
from tests.conftest import PG_URL
from tests.services import Service

pytestmark = pytest.mark.postgres

JOBS = 12
HELD = 3
TIMEOUT = 1.0  # w1's idle_in_transaction_timeout, seconds
# How long the frozen job's lease must have been over (three of w2's reaps, one a second)
# before the test asks whether anything took it.
OVERDUE = 3.0
APP = "tests.apps.pipeline_freeze:app"
# Text of the step commit's fenced trace append (``trace_append_indexed``), its last statement.
_FENCED = "trace_append_indexed: the job''s lease is not held"


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


@dataclass
class Frozen:
    """``w1`` frozen inside job ``HELD``'s pipelined step commit, ``w2`` running."""

    url: str
    app: replayq.App
    sink: Path
    launcher: WorkerLauncher
    w1: WorkerProcess
    w2: WorkerProcess
    held: replayq.Job
    backend_pid: int

    def session(self) -> list[tuple[Any, ...]]:
        """``w1``'s frozen session in ``pg_stat_activity`` (none once the server ended it)."""
        return _rows(
            PG_URL,
            "SELECT state, wait_event, xact_start IS NOT NULL, query"
            " FROM pg_stat_activity WHERE pid = %s",
            (self.backend_pid,),
        )

    def trace(self) -> list[tuple[int | None, str | None, str]]:
        """The held job's events as (attempt, worker, name)."""
        return [(e.attempt, e.worker_id, e.name) for e in self.app.trace(self.held.id)]

    def versions(self) -> list[tuple[Any, ...]]:
        """The attempts that wrote a version of the held job's entity."""
        return _rows(
            self.url,
            "SELECT attempt FROM rq_entity_versions WHERE namespace = 'parcel' AND key = %s",
            (str(HELD),),
        )

    def all_succeeded(self) -> bool:
        return all(j.state.value == "succeeded" for j in self.app.list_jobs(limit=1000))

    def assert_each_effect_once(self, title: str, service: Service) -> None:
        effects = Counter(line["n"] for line in read_lines(self.sink) if line["event"] == "effect")
        assert sorted(effects) == list(range(JOBS)) and max(effects.values()) == 1, effects
        chaos_check.assert_clean(title, self.url, service.base_url, expected=JOBS, sink=self.sink)


def in_the_window(frozen: Frozen) -> bool:
    """Whether ``w1``'s session is inside its transaction, its last statement the step's
    fenced trace append, waiting for more of the pipeline (not idle: no ``Sync`` came)."""
    rows = frozen.session()
    return bool(rows) and rows[0][:3] == ("active", "ClientRead", True) and _FENCED in rows[0][3]


@pytest.fixture
def frozen(
    pg_schema_url: str, tmp_path: Path, effects_service: Service, request: pytest.FixtureRequest
) -> Iterator[Frozen]:
    """``w1`` frozen in the window and everything the docs promise of it checked."""
    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    app = pipeline_freeze.build(pg_schema_url)
    sink = tmp_path / "effects.jsonl"
    for n in range(JOBS):
        app.enqueue("pack", {"n": n, "sink": str(sink)})
    held = next(j for j in app.list_jobs(limit=1000) if j.payload["n"] == HELD)
    mark = tmp_path / "frozen.json"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    frozen_url = f"{pg_schema_url}&idle_in_transaction_timeout={TIMEOUT:g}"
    w1 = WorkerLauncher(frozen_url, tmp_path, launcher.started).start(
        "w1",
        app=APP,
        env={"PIPELINE_FREEZE_JOB": str(HELD), "PIPELINE_FREEZE_MARK": str(mark)},
    )
    with closing(app), workers_ended(request, launcher):
        wait_for(mark.exists, timeout=60, what="w1 to stop itself inside its pipelined commit")
        w1.wait_stopped()
        w2 = launcher.start("w2", app=APP)
        state = Frozen(
            pg_schema_url,
            app,
            sink,
            launcher,
            w1,
            w2,
            held,
            json.loads(mark.read_text())["backend_pid"],
        )

        def held_row() -> tuple[str, str, int, float]:
            """The held job's state, worker, attempt and seconds past its lease deadline."""
            ((job_state, worker_id, attempt, overdue),) = _rows(
                pg_schema_url,
                "SELECT state, worker_id, attempt, extract(epoch FROM now()) - lease_deadline"
                " FROM rq_jobs WHERE id = %s",
                (held.id,),
            )
            return job_state, worker_id, attempt, float("nan" if overdue is None else overdue)

        # The premise: the statements reached the server, COMMIT did not.
        wait_for(
            lambda: in_the_window(state),
            timeout=10,
            what=f"w1's session inside its pipelined transaction: {state.session()}",
        )

        def over_or_taken() -> bool:
            job_state, worker_id, attempt, overdue = held_row()
            return (job_state, worker_id, attempt) != ("running", "w1", 1) or overdue > OVERDUE

        wait_for(over_or_taken, timeout=30, what="the frozen job's lease to run out")
        # The lease ran out (three of w2's reaps ago), and nothing took the job: its row is
        # locked, the reaper's query skips it, and its trace has no lease.expired.
        job_state, worker_id, attempt, overdue = held_row()
        assert (job_state, worker_id, attempt) == ("running", "w1", 1), state.trace()
        assert overdue > OVERDUE
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _rows(
                pg_schema_url, "SELECT 1 FROM rq_jobs WHERE id = %s FOR UPDATE NOWAIT", (held.id,)
            )
        with app.storage.transaction() as tx:
            expired = tx.job_list(LeasesExpired(time.time(), 100, database_clock=True))
        assert held.id not in [j.id for j in expired]
        assert "lease.expired" not in {name for _, _, name in state.trace()}, state.trace()
        # w2 goes on meanwhile: every other job (those w1 leased ahead reaped after their
        # leases, as a frozen worker's jobs are) finishes, and the frozen one is still held.
        wait_for(
            lambda: (
                sum(j.state.value == "succeeded" for j in app.list_jobs(limit=1000)) == JOBS - 1
            ),
            timeout=60,
            what="w2 to finish every other job while w1 is frozen",
        )
        # Past idle_in_transaction_timeout three times over, the session is still there,
        # inside its transaction, waiting for the rest of the pipeline.
        assert in_the_window(state), state.session()
        assert w1.proc.poll() is None
        w1.wait_stopped(timeout=0)
        assert "lease.expired" not in {name for _, _, name in state.trace()}, state.trace()
        print(f"\nw1 frozen past its lease by {held_row()[3]:.1f}s; its job kept, locked")
        yield state


def test_a_worker_thawed_inside_its_pipelined_commit_commits_once_and_nothing_runs_twice(
    frozen: Frozen, effects_service: Service
) -> None:
    frozen.w1.signal(signal.SIGCONT)
    wait_for(frozen.all_succeeded, timeout=60, what="every job to succeed")

    trace = frozen.trace()
    names = Counter(name for _, _, name in trace)
    # The frozen commit went through when w1 thawed: attempt 1's step is committed.
    assert (1, "w1", "state.write") in trace and (1, "w1", "step.finished") in trace, trace
    assert names["write.fenced"] == 0, trace
    assert frozen.versions() == [(1,)], "the entity written once, by the frozen attempt"
    assert names["effect.succeeded"] == 1 and names["job.succeeded"] == 1, trace
    if names["lease.expired"]:
        # Reaped after the commit (its lease had run out): w1's ack refused, attempt 2
        # found the step's writes done.
        assert names["job.write_rejected"] == 1, trace
        again = {name for attempt, _, name in trace if attempt == 2}
        assert {"effect.deduplicated", "state.unchanged", "job.succeeded"} <= again, trace
        print("thawed: committed, then reaped; attempt 2 found the step done")
    else:
        assert (1, "w1", "job.succeeded") in trace, trace
        print("thawed: committed, lease renewed, and w1 finished the job")
    frozen.assert_each_effect_once(
        "PostgreSQL, a worker thawed inside its pipelined commit", effects_service
    )
    # w1 survived and drains on its own.
    assert frozen.w1.proc.poll() is None, frozen.w1.log()
    frozen.w2.kill()
    for n in range(JOBS, JOBS + 3):
        frozen.app.enqueue("pack", {"n": n, "sink": str(frozen.sink)})
    wait_for(frozen.all_succeeded, timeout=60, what="w1 to drain on")
    for worker in frozen.launcher.started:
        assert "Traceback" not in worker.log(), worker.log()


def test_a_worker_killed_inside_its_pipelined_commit_loses_it_and_its_job_is_taken_over(
    frozen: Frozen, effects_service: Service
) -> None:
    # SIGKILL while stopped (no SIGCONT first, which would let COMMIT out).
    frozen.w1.proc.send_signal(signal.SIGKILL)
    frozen.w1.proc.wait(10)
    frozen.w1.stopped = False
    killed_at = time.monotonic()
    wait_for(lambda: not frozen.session(), timeout=10, what="the server to end w1's session")
    ended_after = time.monotonic() - killed_at
    wait_for(frozen.all_succeeded, timeout=60, what="every job to succeed")

    trace = frozen.trace()
    names = Counter(name for _, _, name in trace)
    first = {name for attempt, _, name in trace if attempt == 1}
    # Attempt 1's step was rolled back with the session; its effect's own commits stay.
    assert {"effect.claimed", "effect.succeeded"} <= first, trace
    assert not first & {"state.write", "step.finished", "job.succeeded"}, trace
    assert (1, "w2", "lease.expired") in trace, trace
    again = {name for attempt, worker, name in trace if attempt == 2 and worker == "w2"}
    assert {"effect.deduplicated", "state.write", "job.succeeded"} <= again, trace
    assert names["effect.succeeded"] == 1 and names["job.succeeded"] == 1, trace
    assert frozen.versions() == [(2,)], "the entity written once, by the attempt that took over"
    frozen.assert_each_effect_once(
        "PostgreSQL, a worker killed inside its pipelined commit", effects_service
    )
    print(f"killed: the server ended w1's session {ended_after:.2f}s after SIGKILL")
