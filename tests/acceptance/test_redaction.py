"""Secrets never reach the database, the export or the logs in clear.

A real worker runs ``tests.apps.secrets`` on each backend: a card number in the
payload, a bearer token and a password passed to ``ctx.call``, an API key in the
call's answer and in an effect's result, a token in a log line, and a failing
call whose error quotes the ``Authorization`` header. Afterwards none of those
secrets is in the SQLite file's bytes (WAL included) or in any row of the
PostgreSQL schema (a SQLite trace pack's events read unpacked: its deflated bytes would
not show them), in ``trace export`` or in the worker's log; the markers that
replaced them are keyed hashes (equal secrets, equal markers); and the redacted
job still dry-runs without divergence.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.request
from pathlib import Path

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher
from tests.apps import secret_paths, secrets
from tests.browser.conftest import start_dashboard
from tests.conformance.test_secret_paths import stored_rows
from tests.replay_support import cli, cli_ok

CARD = "4111111111111111"
CARD_SPACED = "4111 1111 1111 1111"
TOKEN = "sk_live_7f3a9c2e5b8d1f4a"
PASSWORD = "hunter2-correct-horse"
SECRETS = (CARD, CARD_SPACED, TOKEN, PASSWORD)
KEY = "test-redaction-key-0123456789"


def _database_bytes(launcher: WorkerLauncher) -> bytes:
    """Every byte replayq stored: the SQLite file and its WAL, or every row of the schema."""
    if isinstance(launcher.database, Path):
        files = sorted(launcher.directory.glob(f"{launcher.database.name}*"))
        assert files, "no database file"
        return b"".join(path.read_bytes() for path in files)
    import psycopg
    from psycopg import sql

    schema = launcher.url.rsplit("search_path%3D", 1)[1]
    chunks: list[bytes] = []
    with psycopg.connect(launcher.url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        assert tables, "no tables in the test schema"
        for (table,) in tables:
            query = sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(schema, table))
            chunks += [row[0].encode() for row in conn.execute(query)]
    return b"\n".join(chunks)


def _export(url: str, job_id: int) -> str:
    return cli_ok(url, "trace", "export", str(job_id), "--app", "tests.apps.secrets:app").stdout


def test_secrets_are_redacted_everywhere_and_the_job_still_dry_runs(
    launcher: WorkerLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"REPLAYQ_REDACTION_KEY": KEY, "GATEWAY_TOKEN": TOKEN, "GATEWAY_PASSWORD": PASSWORD}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = secrets.build(launcher.url)
    try:
        paid = app.enqueue("charge", {"card_number": CARD, "amount": 1250, "note": CARD_SPACED})
        refused = app.enqueue("charge", {"card_number": CARD, "amount": -1})
        if isinstance(launcher.database, Path):
            # The file, its WAL and its shared memory (while this app holds it open): all
            # three hold the payload's bytes.
            files = [Path(f"{launcher.database}{suffix}") for suffix in ("", "-wal", "-shm")]
            modes = {f.name: stat.S_IMODE(os.stat(f).st_mode) for f in files if f.exists()}
            assert len(modes) == 3 and set(modes.values()) == {0o600}, modes
        worker = launcher.start("w1", app="tests.apps.secrets:app", burst=True, env=env)
        assert worker.wait(60) == 0, worker.log()
        assert app.get_job(paid).state == replayq.JobState.SUCCEEDED, worker.log()
        dead = app.get_job(refused)
        assert dead.state == replayq.JobState.DEAD
        # Equal secrets, equal markers: the two payloads name the same (hashed) card.
        marker = app.get_job(paid).payload["card_number"]
        assert marker.startswith("[redacted:") and marker == dead.payload["card_number"]
        assert "gateway refused Bearer [redacted:" in (dead.last_error or "")

        stored = _database_bytes(launcher)
        assert b"[redacted:" in stored
        # A SQLite file's trace packs are deflated: its bytes alone do not show their events.
        unpacked = stored_rows(app)
        exports = [_export(launcher.url, j) for j in (paid, refused)]
        assert all("[redacted:" in text for text in exports)
        json.loads(exports[0])
        log = worker.log()
        assert "charged with Authorization: Bearer [redacted:" in log, log
        for secret in SECRETS:
            assert secret.encode() not in stored, f"{secret!r} is in the database"
            assert secret not in unpacked, f"{secret!r} is in a row"
            assert all(secret not in text for text in exports), f"{secret!r} is in an export"
            assert secret not in log, f"{secret!r} is in the worker's log"

        dry = cli_ok(
            launcher.url,
            "replay",
            str(paid),
            "--app",
            "tests.apps.secrets:app",
            "--mode",
            "dry-run",
            "--no-keep",
            "--json",
        )
        report = json.loads(dry.stdout)
        assert report["diverged"] is False and report["first_divergence"] is None, dry.stdout
        assert report["outcome_now"]["status"] == "succeeded", dry.stdout
        if isinstance(launcher.database, Path):
            assert stat.S_IMODE(os.stat(launcher.database).st_mode) == 0o600
    finally:
        app.close()


PROBE_TOKEN = "sk_live_4c1e8b7a9d2f6e3b"
PROBE_PASSWORD = "tr0ub4dor-and-3"


def test_a_careless_handlers_secrets_reach_no_row_output_or_log_line(
    launcher: WorkerLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tests.apps.secret_paths``: a token in a step's name, a card number and a token as
    object keys, a password nested in arguments, a decision and a child's payload, and
    log lines quoting the token (one with a traceback). A real worker runs it, then the
    real CLI reads, exports, dry-runs and forks it and the dashboard shows it: the dry-run
    and the fork read the token from the environment again and log it, on the CLI's
    stderr."""
    env = {"REPLAYQ_REDACTION_KEY": KEY, "PROBE_TOKEN": PROBE_TOKEN}
    env["PROBE_PASSWORD"] = PROBE_PASSWORD
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = secret_paths.build(launcher.url)
    try:
        jobs = [
            app.enqueue("probe", {"order": 1}),
            app.enqueue("probe", {"order": 2, "mode": "fail"}),
        ]
        worker = launcher.start("w1", app="tests.apps.secret_paths:app", burst=True, env=env)
        assert worker.wait(60) == 0, worker.log()
        assert [app.get_job(j).state for j in jobs] == [
            replayq.JobState.SUCCEEDED,
            replayq.JobState.DEAD,
        ], worker.log()
        log = worker.log()
        assert "Authorization: Bearer [redacted:" in log and "Traceback" in log, log

        spec = "tests.apps.secret_paths:app"
        outputs = [log]
        for job in jobs:
            for args in (
                ("jobs", "show", str(job)),
                ("trace", "show", str(job)),
                ("trace", "export", str(job), "--app", spec),
                ("replay", str(job), "--mode", "dry-run", "--app", spec),
                ("replay", str(job), "--mode", "dry-run", "--app", spec, "--json"),
                ("fork", str(job), "--app", spec, "--from-step", "decide"),
                ("diff", str(job), str(job)),
            ):
                done = cli(launcher.url, *args)
                assert done.returncode in (0, 1), f"{args}: {done.stdout}\n{done.stderr}"
                outputs += [done.stdout, done.stderr]
        dry_run_stderr = outputs[10]
        assert "Authorization: Bearer [redacted:" in dry_run_stderr, dry_run_stderr
        outputs.append(cli_ok(launcher.url, "events").stdout)
        dashboard = start_dashboard(launcher.url, launcher.directory, token=None)
        try:
            for path in ("/", "/jobs", "/dead", *(f"/jobs/{job}" for job in jobs)):
                with urllib.request.urlopen(dashboard.url + path, timeout=30) as page:  # noqa: S310 -- http://127.0.0.1 only
                    outputs.append(page.read().decode())
        finally:
            dashboard.proc.terminate()
            dashboard.proc.wait(30)
        assert "auth Bearer [redacted:" in outputs[-1], outputs[-1]
        stored = stored_rows(app)
        assert "[redacted:" in stored
        for secret in (PROBE_TOKEN, PROBE_PASSWORD, secret_paths.CARD):
            assert secret not in stored, f"{secret!r} is stored"
            for text in outputs:
                assert secret not in text, f"{secret!r} is in an output: {text}"
    finally:
        app.close()
