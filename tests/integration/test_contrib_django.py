"""``replayq.contrib.django`` in a real Django project, on SQLite and on PostgreSQL.

Each step is a real ``manage.py`` process (Django's settings are per process): migrate,
a scenario that enqueues inside committed, rolled-back and nested ``atomic`` blocks,
then ``manage.py replayq_worker --burst`` runs what committed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import replayq

PROJECT = Path(__file__).resolve().parents[1] / "apps" / "djangoshop"


@pytest.fixture(params=["sqlite", "postgres"])
def django_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.db'}"
    return str(request.getfixturevalue("pg_schema_url"))


def manage(db: str, *args: str) -> str:
    env = {**os.environ, "DJANGOSHOP_DB": db, "DJANGO_SETTINGS_MODULE": "settings"}
    env.pop("REPLAYQ_DB", None)
    done = subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_job_enqueued_in_atomic_exists_only_if_the_block_commits_and_the_worker_runs_it(
    django_db: str,
) -> None:
    manage(django_db, "migrate", "--verbosity", "0")
    upgrade = subprocess.run(
        [str(Path(sys.executable).with_name("replayq")), "--db", django_db, "db", "upgrade"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    seen = json.loads(manage(django_db, "shell", "-c", "import orders.scenario").splitlines()[-1])
    ids = seen["ids"]

    assert seen["after_rollback"] == [], "the rolled-back order's job is gone with it"
    assert seen["inside_atomic"] == [], "invisible to other connections until commit"
    assert seen["after_commit"] == [ids["kept"]]
    assert seen["bad_payload"] == "PayloadError"
    assert seen["after_nested"] == [ids["kept"], ids["nested"]]
    # The savepoint's job rolled back with it; the block's own enqueue of that id is one job.
    assert seen["same_id_in_block"] is True
    assert seen["after_savepoint"] == [ids["kept"], ids["nested"], ids["saved"]]
    assert seen["outside_atomic"] == [ids["kept"], ids["nested"], ids["saved"], ids["outside"]]
    assert seen["orders"] == [ids["kept"], ids["nested"], ids["saved"], ids["outside"]]

    out = manage(django_db, "replayq_worker", "--burst")
    assert "succeeded=4" in out

    app = replayq.App(django_db)
    try:
        jobs = app.list_jobs()
        assert {job.state for job in jobs} == {replayq.JobState.SUCCEEDED}
        assert sorted(job.result["confirmed"] for job in jobs) == sorted(seen["orders"])
    finally:
        app.close()
