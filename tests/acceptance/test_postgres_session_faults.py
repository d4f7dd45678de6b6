"""A worker's session ended or its statement cancelled at a chosen moment: in a step's
commit, and in the ack's.

The chaos tests end every session of the workers twenty times, so they reach these paths
only by chance. Here the statement is held where it is wanted: another session of the test
holds a row the statement must lock (the row every ``frozen_tx`` step commit updates; the
job's own row, which the ack updates), the worker's statement waits for it, and the test
ends that backend (``pg_terminate_backend``: SQLSTATE 57P01) or cancels its statement
(``pg_cancel_backend``: 57014, what a ``statement_timeout`` does) — then lets the row go.
docs/postgres.md ("Reconnection"): a step's commit is put back (``storage_fault``), never
failed, its writes and effect once; an ack is retried until it lands, once, and the
handler does not run again.
"""

from __future__ import annotations

from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for, workers_ended
from tests.apps import frozen_tx, sleepy
from tests.conftest import PG_URL

pytestmark = pytest.mark.postgres

ENDS = {"terminate": "57P01", "cancel": "57014"}


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def _end_the_waiting_statement(how: str, like: str, schema_url: str) -> None:
    """``pg_<how>_backend`` on the one session of this test's schema that waits for a lock
    in a statement ``LIKE like``."""
    schema = schema_url.rsplit("search_path%3D", 1)[1]
    import psycopg

    def waiting() -> list[tuple[Any, ...]]:
        with psycopg.connect(schema_url, autocommit=True) as probe:
            found = probe.execute(
                "SELECT a.pid FROM pg_stat_activity a, pg_locks l"
                " JOIN pg_class c ON c.oid = l.relation"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE a.wait_event_type = 'Lock' AND a.query LIKE %s"
                " AND l.pid = a.pid AND n.nspname = %s",
                (like, schema),
            )
            return list({row[0]: row for row in found.fetchall()}.values())

    pids = wait_for(waiting, timeout=30, what=f"a statement {like!r} to wait for the row")
    assert len(pids) == 1, pids
    _rows(PG_URL, f"SELECT pg_{how}_backend(%s)", (pids[0][0],))


@pytest.mark.parametrize("how", sorted(ENDS))
def test_a_step_commit_whose_session_is_ended_or_cancelled_is_put_back_and_runs_once(
    pg_schema_url: str, tmp_path: Path, how: str, request: pytest.FixtureRequest
) -> None:
    import psycopg

    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    for statement in frozen_tx.TABLES:
        _rows(pg_schema_url, statement)
    sink = tmp_path / "effects.jsonl"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    with closing(frozen_tx.build(pg_schema_url)) as app, workers_ended(request, launcher):
        job_id = app.enqueue("pack", {"n": 1, "sink": str(sink)})
        with psycopg.connect(pg_schema_url) as holder:
            holder.execute("SELECT packed FROM frozen_totals WHERE id = 1 FOR UPDATE")
            worker = launcher.start("w1", app="tests.apps.frozen_tx:app")
            _end_the_waiting_statement(how, "UPDATE frozen_totals%", pg_schema_url)
            holder.rollback()
        wait_for(
            lambda: app.get_job(job_id).state.value in ("succeeded", "dead"),
            timeout=60,
            what="the job to end",
        )
        names = Counter(e.name for e in app.trace(job_id))
        assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED, names
        released = [e for e in app.trace(job_id) if e.name == "lease.released"]
        assert len(released) == 1 and ENDS[how] in released[0].data["storage_fault"], released
        assert names["job.failed"] == 0 and names["job.succeeded"] == 1, names
        assert names["effect.succeeded"] == 1 and names["effect.deduplicated"] == 1, names
        assert [line["n"] for line in read_lines(sink) if line["event"] == "effect"] == [1]
        assert _rows(pg_schema_url, "SELECT n FROM frozen_packed") == [(1,)]
        assert _rows(pg_schema_url, "SELECT packed FROM frozen_totals") == [(1,)]
        assert worker.proc.poll() is None and "Traceback" not in worker.log(), worker.log()


@pytest.mark.parametrize("how", sorted(ENDS))
def test_an_ack_whose_session_is_ended_or_cancelled_lands_once_without_a_second_run(
    pg_schema_url: str, tmp_path: Path, how: str, request: pytest.FixtureRequest
) -> None:
    import psycopg

    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    side = tmp_path / "runs.jsonl"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    with closing(sleepy.build(pg_schema_url)) as app, workers_ended(request, launcher):
        job_id = app.enqueue("sleep_long_lease", {"log": str(side), "n": 1, "seconds": 1.0})
        worker = launcher.start("w1")
        wait_for(lambda: read_lines(side), timeout=30, what="the handler to start")
        with psycopg.connect(pg_schema_url) as holder:
            # The job's row, held while the handler sleeps: its ack's UPDATE waits for it.
            holder.execute("SELECT id FROM rq_jobs WHERE id = %s FOR UPDATE", (job_id,))
            _end_the_waiting_statement(how, "UPDATE rq_jobs%succeeded%", pg_schema_url)
            holder.rollback()
        wait_for(
            lambda: app.get_job(job_id).state.value in ("succeeded", "dead"),
            timeout=60,
            what="the job to end",
        )
        names = Counter(e.name for e in app.trace(job_id))
        assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED, names
        assert names["job.succeeded"] == 1 and names["job.leased"] == 1, names
        assert names["job.write_rejected"] == 0 and names["job.failed"] == 0, names
        assert [line["event"] for line in read_lines(side)] == ["start", "end"], "ran once"
        assert worker.proc.poll() is None and "Traceback" not in worker.log(), worker.log()
        assert "group commit of the acks" in worker.log(), "the ack met the fault"
