"""A PostgreSQL server that takes no writes (SQLSTATE 25006) is waited out, never a job failure.

After a failover the old primary's sessions land on a standby, where every write
fails with ``cannot execute ... in a read-only transaction``. The test makes that
happen for real, on a role of its own (never the shared database's other users):
its workers connect as the role, then ``ALTER ROLE ... SET
default_transaction_read_only = on`` and the role's sessions are ended, so every
session the workers open next is read-only. The workers must log the cause, keep
running, fail no job, and — once the setting is reset, without any session being
ended for them — drop their read-only sessions, reconnect and drain every job,
each effect once.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import replayq
from tests import chaos_check
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import storage_faults
from tests.conftest import PG_URL, require_postgres
from tests.services import Service

JOBS = 200


def _as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
def read_only_role(pg_schema_url: str) -> Iterator[tuple[str, str]]:
    """(schema URL as a new login role, role name): the role may use the test's schema."""
    require_postgres()
    import psycopg
    from psycopg import sql

    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    role = f"rq_ro_{uuid.uuid4().hex[:10]}"
    schema = pg_schema_url.rsplit("search_path%3D", 1)[1]
    ident, space = sql.Identifier(role), sql.Identifier(schema)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(space, ident))
        for kind in ("TABLES", "SEQUENCES"):
            admin.execute(
                sql.SQL("GRANT ALL ON ALL {} IN SCHEMA {} TO {}").format(
                    sql.SQL(kind), space, ident
                )
            )
    try:
        yield _as_role(pg_schema_url, role), role
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))


def _set_read_only(role: str, on: bool) -> None:
    import psycopg
    from psycopg import sql

    ident = sql.Identifier(role)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        if on:
            admin.execute(
                sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(ident)
            )
            # As in a failover: the role's sessions end, and the next ones are read-only.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
        else:
            admin.execute(
                sql.SQL("ALTER ROLE {} RESET default_transaction_read_only").format(ident)
            )


def test_a_read_only_server_is_waited_out_and_no_job_fails(
    read_only_role: tuple[str, str], pg_schema_url: str, tmp_path: Path, effects_service: Service
) -> None:
    worker_url, role = read_only_role
    sink = tmp_path / "effects.jsonl"
    app = storage_faults.build(pg_schema_url)
    launcher = WorkerLauncher(worker_url, tmp_path)
    try:
        for n in range(JOBS):
            app.enqueue("deliver", {"n": n, "sink": str(sink)})
        # Job 10 waits inside its step until the fault is on: its step's commit meets it.
        hold, env = storage_faults.hold_inside_step(tmp_path)
        workers = [
            launcher.start(f"w{i}", app="tests.apps.storage_faults:app", env=env) for i in (1, 2)
        ]

        def succeeded() -> int:
            return sum(1 for j in app.list_jobs(limit=1000) if j.state.value == "succeeded")

        # The server turns read-only while the workers are in the middle of the queue: the
        # jobs in flight meet it at a step's commit, an effect's record or their ack.
        wait_for(lambda: succeeded() >= 10, timeout=60, what="the drain to be under way")
        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="job 10 inside its step")
        held = next(j for j in app.list_jobs(limit=1000) if j.payload["n"] == 10)
        assert held.state.value == "running", "job 10 is held inside its step"
        _set_read_only(role, on=True)
        wait_for(
            lambda: any("SQLSTATE 25006" in w.log() for w in workers),
            timeout=30,
            what="a worker to say the server takes no writes",
        )
        hold.unlink()  # job 10's step now commits into the read-only server
        before = succeeded()
        assert before < JOBS, "the fault came while jobs were left"
        time.sleep(2.0)
        assert succeeded() == before, "no job can finish while the workers' server is read-only"
        _set_read_only(role, on=False)
        writable = time.monotonic()
        wait_for(lambda: succeeded() == JOBS, timeout=90, what="every job to succeed")
        chaos_check.assert_clean(
            "PostgreSQL, the workers' server read-only (SQLSTATE 25006) for a while",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS,
            recovery_seconds=time.monotonic() - writable,
            sink=sink,
        )

        states = Counter(j.state.value for j in app.list_jobs(limit=1000))
        assert states == {"succeeded": JOBS}
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert sorted(effects) == list(range(JOBS)) and max(effects.values()) == 1
        for worker in workers:
            assert worker.proc.poll() is None, f"worker {worker.worker_id} exited\n{worker.log()}"
            assert "Traceback" not in worker.log(), worker.log()
        failed = [
            e for j in app.list_jobs(limit=1000) for e in app.trace(j.id) if e.name == "job.failed"
        ]
        assert failed == [], "a read-only server is never a job's failure"
        held_trace = app.trace(held.id)
        put_back = [e for e in held_trace if e.name == "lease.released"]
        assert put_back and "storage_fault" in put_back[0].data, (
            "the held job was put back, not failed: "
            f"{[(e.name, e.worker_id, e.attempt) for e in held_trace]}"
        )
    except BaseException:
        for worker in launcher.started:
            print(f"--- worker {worker.worker_id} ---\n{worker.log()}")
        raise
    finally:
        launcher.kill_all()
        app.close()


def test_a_writing_command_on_a_read_only_server_exits_3_and_writes_nothing(
    pg_schema_url: str,
) -> None:
    """docs/reliability.md, exit 3: "cannot take writes for now (… read-only)". The role's
    sessions are read-only (a standby after a failover): ``replayq enqueue`` and ``jobs
    cancel`` exit 3 with one line naming SQLSTATE 25006 and change nothing; a read (``jobs
    list``) still answers; once the setting is reset the same commands go through."""
    from tests.acceptance.workers import run_cli
    from tests.pg_roles import login_role

    payload = '{"log": "/dev/null", "n": 1, "seconds": 0}'

    with login_role(pg_schema_url, settings={"default_transaction_read_only": "on"}) as (
        role_url,
        role,
    ):
        app = replayq.App(pg_schema_url)
        try:
            queued = app.enqueue("anything", {}, check=False)
            for args in (
                ("enqueue", "sleep", "--app", "tests.apps.sleepy:app", "--payload", payload),
                ("jobs", "cancel", str(queued)),
            ):
                refused = run_cli(role_url, *args)
                assert refused.returncode == 3, (args, refused.stdout, refused.stderr)
                lines = refused.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
                assert "25006" in lines[0], lines[0]
            listed = run_cli(role_url, "jobs", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            assert [j.id for j in app.list_jobs(limit=10)] == [queued], "nothing written"
            assert app.get_job(queued).state is replayq.JobState.QUEUED

            _set_read_only(role, False)
            assert run_cli(role_url, *args).returncode == 0
            enqueued = run_cli(
                role_url, "enqueue", "sleep", "--app", "tests.apps.sleepy:app", "--payload", payload
            )
            assert enqueued.returncode == 0, enqueued.stderr
            assert app.get_job(queued).state is replayq.JobState.CANCELLED
            assert len(app.list_jobs(limit=10)) == 2
        finally:
            app.close()
