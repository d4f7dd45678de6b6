"""No connection slot to be had (``too many connections``, SQLSTATE 53300) is waited out.

The workers log in as a role of the test's own with ``CONNECTION LIMIT 3`` (the shared
server's ``max_connections`` is never touched: other suites use it). First another client
takes the role's three slots: ``replayq jobs list`` exits 3 with one line naming the
server's reason, and a worker started then (``--concurrency 4``, ``pool_size=7``: more
than the limit will ever give it) waits instead of exiting, leasing nothing. Once the
client lets go, the worker drains the queue with the connections it can get. Then, with a
job held inside its step, the role's limit is set to 0 and its sessions are ended (every
reconnect refused): the held job's commit meets the ended session and the job is put
back, not failed; once the limit is 3 again every job succeeds, each effect once.
docs/postgres.md ("Pool size and workers per host") and docs/reliability.md (exit 3).
"""

from __future__ import annotations

import uuid
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

import replayq
from tests import chaos_check
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli, wait_for, workers_ended
from tests.apps import storage_faults
from tests.conftest import PG_URL
from tests.pg_roles import login_role
from tests.services import Service

pytestmark = pytest.mark.postgres

JOBS = 40
LIMIT = 3


def _set_limit(role: str, limit: int, *, end_sessions: bool) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                sql.Identifier(role), sql.Literal(limit)
            )
        )
        if end_sessions:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )


def test_a_role_out_of_connection_slots_is_waited_out_and_no_job_fails(
    pg_schema_url: str, tmp_path: Path, effects_service: Service, request: pytest.FixtureRequest
) -> None:
    import psycopg

    sink = tmp_path / "effects.jsonl"
    launcher = WorkerLauncher(pg_schema_url, tmp_path)
    hold, env = storage_faults.hold_inside_step(tmp_path)
    with (
        login_role(pg_schema_url, connection_limit=LIMIT) as (role_url, role),
        closing(storage_faults.build(pg_schema_url)) as app,
        workers_ended(request, launcher),
    ):
        ids = [app.enqueue("deliver", {"n": n, "sink": str(sink)}) for n in range(JOBS)]
        limited = WorkerLauncher(f"{role_url}&pool_size=7", tmp_path, launcher.started)

        others = [psycopg.connect(role_url) for _ in range(LIMIT)]
        try:
            refused = run_cli(role_url, "jobs", "list")
            assert refused.returncode == 3, (refused.returncode, refused.stdout, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
            assert "too many connections for role" in lines[0], lines[0]

            worker = limited.start(
                "w1", app="tests.apps.storage_faults:app", concurrency=4, env=env
            )
            wait_for(
                lambda: "database unavailable" in worker.log(),
                timeout=30,
                what="the worker to meet the full role and say so",
            )
            assert worker.proc.poll() is None, worker.log()
            assert {j.state for j in app.list_jobs(limit=100)} == {replayq.JobState.QUEUED}
        finally:
            for other in others:
                other.close()

        wait_for(lambda: storage_faults.inside(hold), timeout=60, what="the held job's step")
        outages = worker.log().count("database unavailable")
        _set_limit(role, 0, end_sessions=True)
        hold.unlink()  # its commit meets the ended session; no new one is let in
        wait_for(
            lambda: worker.log().count("database unavailable") > outages,
            timeout=30,
            what="the worker to meet the ended sessions and the closed role",
        )
        _set_limit(role, LIMIT, end_sessions=False)

        wait_for(
            lambda: all(j.state is replayq.JobState.SUCCEEDED for j in app.list_jobs(limit=100)),
            timeout=60,
            what="every job to succeed once slots are free again",
        )
        chaos_check.assert_clean(
            "PostgreSQL, the workers' role out of connection slots",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS,
            sink=sink,
        )
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects == Counter(range(JOBS)), "each effect once"
        failed = [e for i in ids for e in app.trace(i) if e.name == "job.failed"]
        assert not failed, failed
        held = [e for e in app.trace(ids[storage_faults.HELD_JOB]) if e.name == "lease.released"]
        assert held and "storage_fault" in held[0].data, "the held job was put back"
        assert worker.proc.poll() is None, worker.log()
        assert "Traceback" not in worker.log(), worker.log()
        worker.kill()  # its pool and listener hold every slot of the role
        listed = run_cli(role_url, "jobs", "list")
        assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize("pool_size", [1, 7])
def test_a_worker_opens_at_most_pool_size_plus_one_sessions_and_a_small_pool_only_waits(
    pg_schema_url: str, tmp_path: Path, pool_size: int, request: pytest.FixtureRequest
) -> None:
    """docs/postgres.md: count ``pool_size + 1`` sessions a worker process (its pool and
    its LISTEN); ``concurrency + 3`` never waits, and less only waits (a pooled connection
    is asked for before a transaction opens, never inside one: no deadlock at 1)."""
    import threading

    import psycopg

    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    sink = tmp_path / "effects.jsonl"
    name = f"rq-pool-{uuid.uuid4().hex[:8]}"
    launcher = WorkerLauncher(
        f"{pg_schema_url}&pool_size={pool_size}&application_name={name}", tmp_path
    )
    peak = 0
    done = threading.Event()

    def count_sessions() -> None:
        nonlocal peak
        with psycopg.connect(PG_URL, autocommit=True) as probe:
            while not done.is_set():
                row = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
                peak = max(peak, row[0] if row else 0)
                done.wait(0.005)

    with closing(storage_faults.build(pg_schema_url)) as app, workers_ended(request, launcher):
        ids = [app.enqueue("deliver", {"n": n, "sink": str(sink)}) for n in range(JOBS * 3)]
        counter = threading.Thread(target=count_sessions, daemon=True)
        counter.start()
        worker = launcher.start("w1", app="tests.apps.storage_faults:app", concurrency=4)
        try:
            wait_for(
                lambda: all(
                    j.state is replayq.JobState.SUCCEEDED for j in app.list_jobs(limit=1000)
                ),
                timeout=60,
                what="every job to succeed",
            )
        finally:
            done.set()
            counter.join(10)
        assert 0 < peak <= pool_size + 1, peak
        names = Counter(e.name for i in ids for e in app.trace(i))
        assert names["lease.released"] == names["job.failed"] == 0, names
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects == Counter(range(JOBS * 3)), "each effect once"
        assert "Traceback" not in worker.log() and "WARNING" not in worker.log(), worker.log()
