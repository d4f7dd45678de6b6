"""A statement the server cancels (SQLSTATE 57014) is waited out, never a job's failure.

A ``statement_timeout`` set for the workers' role or database, or an operator's
``pg_cancel_backend``, cancels a statement: its transaction rolls back, its session stays
good, and the same statement may pass a moment later. Worker ``w1`` logs in as a role of the
test's own whose ``statement_timeout`` is 1 s (``ALTER ROLE … SET``), and another session of
the test holds the one row every job's step commit updates (``tests/apps/frozen_tx.py``):
the commit waits for it, the server cancels it after 1 s. The job must be put back
(``lease.released`` with ``storage_fault``), not failed, and once the row is free every job
succeeds, each effect once, each step's writes once. Before, the cancel was a plain
``StorageError``: the job went to ``dead`` (class ``unknown``, not retryable) on its first
attempt, and the command line exited 2 ("usage, or not found") for it.
"""

from __future__ import annotations

from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests import chaos_check
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli, wait_for, workers_ended
from tests.apps import frozen_tx
from tests.pg_roles import login_role
from tests.services import Service

pytestmark = pytest.mark.postgres

JOBS = 6
# The server's statement_timeout for the role of w1's sessions (and the command's).
STATEMENT_TIMEOUT = {"statement_timeout": "1s"}


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def _migrated(url: str) -> None:
    migrator = replayq.App(url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()


def test_a_step_commit_cancelled_by_statement_timeout_is_put_back_and_runs_once(
    pg_schema_url: str, tmp_path: Path, effects_service: Service, request: pytest.FixtureRequest
) -> None:
    import psycopg

    _migrated(pg_schema_url)
    for statement in frozen_tx.TABLES:
        _rows(pg_schema_url, statement)
    app = frozen_tx.build(pg_schema_url)
    sink = tmp_path / "effects.jsonl"
    ids = [app.enqueue("pack", {"n": n, "sink": str(sink)}) for n in range(JOBS)]
    launcher = WorkerLauncher(pg_schema_url, tmp_path)

    def ended_or_put_back() -> list[replayq.TraceEvent]:
        return [
            e
            for e in app.trace(ids[0])
            if e.name in ("lease.released", "job.failed", "job.dead", "job.succeeded")
        ]

    with (
        login_role(pg_schema_url, settings=STATEMENT_TIMEOUT) as (role_url, _),
        closing(app),
        workers_ended(request, launcher),
    ):
        timed_out = WorkerLauncher(role_url, tmp_path, launcher.started)
        with psycopg.connect(pg_schema_url) as holder:
            holder.execute("SELECT packed FROM frozen_totals WHERE id = 1 FOR UPDATE")
            w1 = timed_out.start("w1", app="tests.apps.frozen_tx:app")
            first = wait_for(
                ended_or_put_back, timeout=60, what="job 0's commit to meet the timeout"
            )[0]
            holder.rollback()  # the row is free: the next attempt's commit goes through
        assert first.name == "lease.released", f"job 0 {first.name}: {first.data}"
        assert "57014" in first.data["storage_fault"], first.data

        wait_for(
            lambda: all(j.state.value == "succeeded" for j in app.list_jobs(limit=100)),
            timeout=60,
            what="every job to succeed",
        )
        chaos_check.assert_clean(
            "PostgreSQL, a step commit cancelled by statement_timeout",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS,
            sink=sink,
        )
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects == Counter(range(JOBS)), "each effect once"
        packed = Counter(n for (n,) in _rows(pg_schema_url, "SELECT n FROM frozen_packed"))
        assert packed == Counter(range(JOBS)), "each job's step writes applied once"
        assert _rows(pg_schema_url, "SELECT packed FROM frozen_totals") == [(JOBS,)]
        names = Counter(e.name for e in app.trace(ids[0]))
        assert names["job.failed"] == 0 and names["job.succeeded"] == 1, names
        assert names["effect.succeeded"] == 1 and names["effect.deduplicated"] >= 1, names
        assert names["retry.scheduled"] == 0, "put back, no retry counted"
        assert w1.proc.poll() is None, w1.log()
        assert "Traceback" not in w1.log(), w1.log()


def test_a_command_whose_statement_is_cancelled_exits_3_and_changes_nothing(
    pg_schema_url: str,
) -> None:
    import psycopg

    app = replayq.App(pg_schema_url)
    with login_role(pg_schema_url, settings=STATEMENT_TIMEOUT) as (role_url, _), closing(app):
        job_id = app.enqueue("anything", {}, check=False)
        with psycopg.connect(pg_schema_url) as holder:
            holder.execute("SELECT id FROM rq_jobs WHERE id = %s FOR UPDATE", (job_id,))
            refused = run_cli(role_url, "jobs", "cancel", str(job_id), "--reason", "x")
        assert refused.returncode == 3, (refused.returncode, refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
        assert "statement timeout" in lines[0] and "57014" in lines[0], lines[0]
        assert app.get_job(job_id).state is replayq.JobState.QUEUED, "nothing changed"

        done = run_cli(role_url, "jobs", "cancel", str(job_id), "--reason", "x")
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert app.get_job(job_id).state is replayq.JobState.CANCELLED


def test_an_ack_whose_own_write_is_cancelled_every_time_is_put_back_not_held(
    pg_schema_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A ``ctx.db_write`` made outside any step commits with the job's ack; one slower than
    the ``statement_timeout`` is cancelled on every try. Waited out as an outage, its group
    commit was tried again whole for as long as the worker ran: the job stayed ``running``,
    its lease extended beat after beat, its slot taken, and the acks grouped with it (a
    ``quick`` job's) held with it. It must end as a step's commit cancelled so does: put back
    (``lease.released``, ``storage_fault`` 57014) ``STORAGE_FAULT_RELEASES`` times, then
    failed (class ``dependency``) until ``dead``, and every ``quick`` job acked."""
    from replayq.worker.outcome import STORAGE_FAULT_RELEASES
    from tests.apps import slow_db_write

    _migrated(pg_schema_url)
    app = slow_db_write.build(pg_schema_url)
    slow = app.enqueue("slow", {"n": 0, "where": "ack", "seconds": 2})
    quick = [app.enqueue("quick", {"n": n}) for n in range(1, 7)]
    launcher = WorkerLauncher(f"{pg_schema_url}%20-cstatement_timeout%3D200", tmp_path)
    with closing(app), workers_ended(request, launcher):
        w1 = launcher.start("w1", app="tests.apps.slow_db_write:app", concurrency=2)
        wait_for(
            lambda: any(e.name == "lease.released" for e in app.trace(slow)),
            timeout=60,
            what="the slow job's ack, cancelled again and again, to put it back",
        )
        wait_for(
            lambda: app.get_job(slow).state is replayq.JobState.DEAD,
            timeout=120,
            what="the slow job to fail its attempts",
        )
        assert [app.get_job(j).state.value for j in quick] == ["succeeded"] * len(quick)
        trace = app.trace(slow)
        released = [e for e in trace if e.name == "lease.released"]
        assert len(released) == STORAGE_FAULT_RELEASES, [e.name for e in trace]
        assert all("57014" in e.data["storage_fault"] for e in released), released
        failed = [e for e in trace if e.name == "job.failed"]
        assert [e.data["error_class"] for e in failed] == ["dependency", "dependency"], failed
        assert not any(e.name == "job.succeeded" for e in trace)
        assert w1.proc.poll() is None, w1.log()
        assert "Traceback" not in w1.log(), w1.log()


def test_an_ack_settled_alone_whose_write_is_cancelled_every_time_is_put_back(
    pg_schema_url: str,
) -> None:
    """The same ack settled on its own (``lease()`` then ``execute(job)``, as for a routed
    type's job): its settle waited the cancel out without end, ``execute`` never returned
    and the job stayed ``running``. Cancelled on every try, it is put back instead."""
    import threading

    from tests.apps import slow_db_write

    _migrated(pg_schema_url)
    app = slow_db_write.build(f"{pg_schema_url}%20-cstatement_timeout%3D200")
    with closing(app):
        slow = app.enqueue("slow", {"n": 0, "where": "ack", "seconds": 2})
        worker = replayq.Worker(app, worker_id="inline")
        [job] = worker.lease(1)
        done = threading.Event()

        def execute() -> None:
            worker.execute(job)
            done.set()

        threading.Thread(target=execute, daemon=True).start()
        wait_for(done.is_set, timeout=60, what="execute() to settle the job")
        assert app.get_job(slow).state is replayq.JobState.QUEUED
        [released] = [e for e in app.trace(slow) if e.name == "lease.released"]
        assert "57014" in released.data["storage_fault"], released.data
