"""A schema backed up with ``pg_dump -Fc`` and restored with ``pg_restore`` is the queue it
was, and a worker left running across the restore is still woken by ``NOTIFY``.

docs/postgres.md ("Upgrading the schema") tells operators to take a ``pg_dump -Fc`` before
an upgrade and to restore it to go back. Real ``pg_dump`` and ``pg_restore`` processes on
the test's schema: every migration still applied, the jobs and their traces there, new job
ids above the old ones (the sequence restored with the rows: an id is never given twice).

The worker runs with ``--poll-interval 600`` and no scheduler, so within the test only a
wake-up can start a job. A wake-up names its installation by the oid of its ``rq_jobs``,
and the restore makes that table anew, under a new oid; the worker's listener kept the old
one for as long as its session lived, ignored every wake-up after the restore and left
new jobs to the poll (28 s of a 30 s poll, measured by hand).
"""

from __future__ import annotations

import json
import subprocess
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli, wait_for, workers_ended
from tests.apps import sleepy
from tests.conftest import PG_URL

pytestmark = pytest.mark.postgres


def _libpq_args() -> list[str]:
    parts = urlsplit(PG_URL)
    return [
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
        "-d",
        parts.path.lstrip("/"),
    ]


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)


def test_a_restored_schema_is_the_queue_it_was_and_wakes_a_running_worker(
    pg_schema_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import psycopg
    from psycopg import sql

    schema = pg_schema_url.rsplit("search_path%3D", 1)[1]
    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    side = tmp_path / "runs.jsonl"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)

    def job(n: int) -> dict[str, object]:
        return {"log": str(side), "n": n, "seconds": 0}

    with workers_ended(request, launcher):
        worker = launcher.start("w1", options=("--poll-interval", "600", "--no-scheduler"))
        with closing(sleepy.build(pg_schema_url)) as app:
            before = app.enqueue("sleep_long_lease", job(1))
            wait_for(
                lambda: app.get_job(before).state is replayq.JobState.SUCCEEDED,
                timeout=30,
                what="the worker to be woken for the first job",
            )
            trace_before = [e.name for e in app.trace(before)]
        dump = tmp_path / "queue.dump"
        _run("pg_dump", "-Fc", "-n", schema, "-f", str(dump), *_libpq_args())
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        _run("pg_restore", *_libpq_args(), str(dump))

        status = run_cli(pg_schema_url, "db", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert all(s["applied_at"] is not None for s in json.loads(status.stdout))
        with closing(sleepy.build(pg_schema_url)) as app:
            assert app.get_job(before).state is replayq.JobState.SUCCEEDED
            assert [e.name for e in app.trace(before)] == trace_before
            after = app.enqueue("sleep_long_lease", job(2))
            assert after > before, "the id sequence came back with the rows"
            wait_for(
                lambda: app.get_job(after).state is replayq.JobState.SUCCEEDED,
                timeout=30,
                what="the running worker to be woken for a job enqueued after the restore",
            )
        assert [line["n"] for line in read_lines(side) if line["event"] == "start"] == [1, 2]
        assert worker.proc.poll() is None and "Traceback" not in worker.log(), worker.log()
