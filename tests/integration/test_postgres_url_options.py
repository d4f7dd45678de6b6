"""The parameters of a PostgreSQL URL that are not replayq's reach libpq as written.

docs/postgres.md promises that everything but replayq's own options (``pool_size``, …) is
passed to libpq unchanged, e.g. ``options=-csearch_path%3Dtenant_a``. libpq decodes
``%XX`` and nothing else: a ``+`` stays a plus sign. replayq used to decode the query and
encode it again with ``urlencode``, which writes a space as ``+``: two settings in one
``options`` (``-csearch_path%3Dx%20-cstatement_timeout%3D5s``) became one search path
``x+-cstatement_timeout=5s`` — another schema, without a word — and no timeout; an
``application_name`` with a space got a plus instead. Checked on the sessions the server
holds: a pooled one of the storage, and a real ``replayq`` process's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import replayq
from replayq.storage.postgres import PostgresStorage, parse_postgres_url
from tests.acceptance.workers import WorkerLauncher, wait_for
from tests.apps import sleepy

pytestmark = pytest.mark.postgres


def _with_settings(pg_schema_url: str, name: str) -> str:
    """The schema's URL with a second setting in its ``options`` and an application name
    that has a space and a plus sign in it."""
    return (
        f"{pg_schema_url}%20-cstatement_timeout%3D4321&application_name={name}%20a%2Bb&pool_size=2"
    )


def test_every_setting_of_the_options_parameter_reaches_the_session(pg_schema_url: str) -> None:
    name = f"rq-url-{uuid.uuid4().hex[:8]}"
    schema = pg_schema_url.rsplit("search_path%3D", 1)[1]
    storage = PostgresStorage(_with_settings(pg_schema_url, name))
    try:
        assert storage.pool_size == 2
        with storage.transaction() as tx:
            seen = tx.connection.execute(
                "SELECT current_setting('search_path'), current_setting('statement_timeout'),"
                " current_setting('application_name')"
            ).fetchone()
    finally:
        storage.close()
    assert seen is not None
    assert tuple(seen) == (schema, "4321ms", f"{name} a+b")


def test_a_worker_runs_in_the_schema_and_under_the_name_its_url_gives(
    pg_schema_url: str, tmp_path: Path
) -> None:
    name = f"rq-url-{uuid.uuid4().hex[:8]}"
    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    app = sleepy.build(pg_schema_url)
    launcher = WorkerLauncher(_with_settings(pg_schema_url, name), tmp_path)
    side = tmp_path / "runs.jsonl"
    try:
        job_id = app.enqueue("sleep_long_lease", {"log": str(side), "n": 1, "seconds": 0})
        worker = launcher.start("w1")
        wait_for(
            lambda: app.get_job(job_id).state is replayq.JobState.SUCCEEDED,
            timeout=20,
            what="the worker to run the job in its URL's schema",
        )
        assert "Traceback" not in worker.log(), worker.log()
        with psycopg.connect(pg_schema_url, autocommit=True) as probe:
            names = Counter(
                row[0]
                for row in probe.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
                    (f"{name}%",),
                )
            )
        # Its pooled session and its LISTEN session, under the name as written.
        assert set(names) == {f"{name} a+b"} and names[f"{name} a+b"] >= 2, names
    finally:
        launcher.kill_all()
        app.close()


def test_the_liveness_parameters_are_added_unless_the_url_sets_them() -> None:
    """docs/postgres.md ("half-open sockets"): keepalives and ``tcp_user_timeout`` are
    added, a value the URL gives is kept as given, and replayq's own options are taken out."""
    conninfo, ours = parse_postgres_url(
        "postgresql://u@h/db?tcp_user_timeout=2500&pool_size=3&options=-ca%3Db%20-cc%3Dd"
    )
    query = conninfo.split("?", 1)[1].split("&")
    assert ours == {"pool_size": "3"}
    assert query[:2] == ["tcp_user_timeout=2500", "options=-ca%3Db%20-cc%3Dd"]
    assert {"keepalives=1", "keepalives_idle=5", "keepalives_interval=2"} <= set(query)
    assert "tcp_user_timeout=10000" not in query


def test_a_value_written_with_characters_libpq_refuses_bare_still_reaches_the_session(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """A URL as people write it by hand: ``options=-csearch_path=tenant`` with a bare ``=``
    and an ``application_name`` ending in a lone ``%``. libpq's URI parser refuses both
    (``extra key/value separator "="``, ``invalid percent-encoded token``); when the query
    was re-encoded they reached it escaped, and passed as written they made every
    ``replayq`` command exit 3, "cannot connect", the server never asked."""
    name = f"rq-url-{uuid.uuid4().hex[:8]}"
    schema = pg_schema_url.rsplit("search_path%3D", 1)[1]
    base = pg_schema_url.rsplit("options=", 1)[0]
    url = f"{base}options=-csearch_path={schema}&application_name={name}%20100%&pool_size=2"
    replayq.App(pg_schema_url, auto_migrate=True).storage.close()
    storage = PostgresStorage(url)
    try:
        with storage.transaction() as tx:
            seen = tx.connection.execute(
                "SELECT current_setting('search_path'), current_setting('application_name')"
            ).fetchone()
    finally:
        storage.close()
    assert seen is not None
    assert tuple(seen) == (schema, f"{name} 100%")
    env = {k: v for k, v in os.environ.items() if k not in ("REPLAYQ_DB", "REPLAYQ_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*sys.path, str(tmp_path)) if p)
    replayq_cli = str(Path(sys.executable).with_name("replayq"))
    done = subprocess.run(
        [replayq_cli, "--db", url, "jobs", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
