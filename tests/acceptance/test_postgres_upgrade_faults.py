"""``replayq db upgrade`` under the faults docs/postgres.md ("Upgrading the schema") names:
several upgraders at once, a lock held by another session, its own session ended.

Each is a real ``replayq`` process on a fresh schema. The lock: the schema as a release
before migration 0026 left it (``tests/migration/older.py``), and another session inside
a transaction that has read ``rq_blobs`` (a report, an old worker's commit), so 0026's
``ALTER TABLE rq_blobs`` waits for its ``ACCESS EXCLUSIVE`` lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import Any

import pytest

from tests.acceptance.workers import REPLAYQ, ROOT, run_cli, wait_for
from tests.conftest import PG_URL
from tests.migration.older import migrated_before, version_named

pytestmark = pytest.mark.postgres


def _pending(url: str) -> list[int]:
    status = run_cli(url, "db", "status", "--json")
    assert status.returncode == 0, status.stderr
    return [s["version"] for s in json.loads(status.stdout) if s["applied_at"] is None]


def _upgrade(url: str) -> subprocess.Popen[str]:
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [REPLAYQ, "--db", url, "db", "upgrade"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_three_upgrades_at_once_apply_each_migration_once(pg_schema_url: str) -> None:
    import psycopg

    upgraders = [_upgrade(pg_schema_url) for _ in range(3)]
    outputs = [upgrader.communicate(timeout=60) for upgrader in upgraders]
    assert [u.returncode for u in upgraders] == [0, 0, 0], outputs
    applied = [out.count("applied ") for out, _ in outputs]
    total = len(_all_versions(pg_schema_url))
    assert sorted(applied) == [0, 0, total], outputs  # one applied all, the others none
    assert _pending(pg_schema_url) == []
    with psycopg.connect(pg_schema_url) as conn:
        rows = conn.execute("SELECT version, count(*) FROM rq_schema_migrations GROUP BY 1")
        assert {count for _, count in rows} == {1}


def _all_versions(url: str) -> list[int]:
    status = run_cli(url, "db", "status", "--json")
    return [s["version"] for s in json.loads(status.stdout)]


def test_an_upgrade_waiting_for_a_lock_queues_the_table_and_ends_with_nothing_applied(
    pg_schema_url: str,
) -> None:
    import psycopg

    blob_keys = version_named("blob_keys")
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        migrated_before(conn, blob_keys)
    pending = _pending(pg_schema_url)
    assert pending and pending[0] == blob_keys

    with (
        psycopg.connect(pg_schema_url) as reader,
        psycopg.connect(PG_URL, autocommit=True) as admin,
    ):
        reader.execute("SELECT count(*) FROM rq_blobs")  # its transaction stays open

        # With a lock_timeout of its own (the URL's libpq options) it gives up: exit 3.
        bounded = run_cli(f"{pg_schema_url}%20-clock_timeout%3D500", "db", "upgrade")
        assert bounded.returncode == 3, (bounded.stdout, bounded.stderr)
        assert "55P03" in _one_error_line(bounded.stderr)
        assert _pending(pg_schema_url) == pending, "nothing applied"

        # Without one it waits, and whoever wants the table next waits behind it.
        upgrader = _upgrade(pg_schema_url)
        waiting = wait_for(
            lambda: admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%ALTER TABLE rq_blobs%",),
            ).fetchone(),
            timeout=30,
            what="the upgrade to wait for rq_blobs' lock",
        )[0]
        probe_done: list[Any] = []

        def probe() -> None:
            with psycopg.connect(pg_schema_url, application_name="rq-upgrade-probe") as conn:
                probe_done.append(conn.execute("SELECT count(*) FROM rq_blobs").fetchone())

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        wait_for(
            lambda: admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'rq-upgrade-probe'"
                " AND wait_event_type = 'Lock'"
            ).fetchone(),
            timeout=30,
            what="a read of rq_blobs to queue behind the waiting upgrade",
        )
        assert _pending(pg_schema_url) == pending, "nothing applied while it waits"

        admin.execute("SELECT pg_terminate_backend(%s)", (waiting,))
        _, stderr = upgrader.communicate(timeout=30)
        assert upgrader.returncode == 3, stderr
        assert "57P01" in _one_error_line(stderr)
        prober.join(30)
        assert probe_done, "the queued read went on once the upgrade was gone"
        assert _pending(pg_schema_url) == pending, "nothing applied"
        reader.rollback()

    done = run_cli(pg_schema_url, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("applied ") == len(pending), done.stdout
    assert _pending(pg_schema_url) == []
