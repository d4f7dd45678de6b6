"""A user's mistake gets one line on stderr and the exit code from the table, never a traceback.

The real ``replayq`` console script in a subprocess, as a user runs it. Exit codes
(``replayq.cli.main``, docs/reliability.md): 0 done, 1 findings, 2 usage or not
found, 3 storage unavailable, 4 internal error; 141 the output's reader went away.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPLAYQ = str(Path(sys.executable).with_name("replayq"))
ROOT = Path(__file__).resolve().parents[2]

APP_MODULE = """
import replayq
app = replayq.App()

@app.job("echo")
def echo(ctx, value):
    return value
"""


def user_env(cwd: Path) -> dict[str, str]:
    """The environment a user's shell gives ``replayq``: the app's folder importable, and
    the caller's PYTHONPATH kept (else the console script runs the installed replayq,
    not the tree under test)."""
    env = {k: v for k, v in os.environ.items() if k not in ("REPLAYQ_DB", "REPLAYQ_DEBUG")}
    paths = [str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run(cwd: Path, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    env = user_env(cwd)
    argv = [REPLAYQ, *(["--db", db] if db else []), *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "userapp.py").write_text(APP_MODULE)
    return tmp_path


@pytest.fixture
def db(workdir: Path) -> str:
    url = f"sqlite:///{workdir / 'queue.db'}"
    assert run(workdir, "db", "upgrade", db=url).returncode == 0
    return url


def test_a_lone_surrogate_in_a_payload_is_refused_naming_the_field(workdir: Path, db: str) -> None:
    payload = '{"value": "\\ud800"}'
    done = run(workdir, "enqueue", "echo", "--app", "userapp:app", "--payload", payload, db=db)
    one_line_error(done, 2, "payload.value", "lone surrogate")


def test_a_payload_nested_ten_thousand_deep_is_refused(workdir: Path, db: str) -> None:
    payload = json.dumps({"value": 0})[:-2] + "[" * 10_000 + "]" * 10_000 + "}"
    done = run(workdir, "enqueue", "echo", "--app", "userapp:app", "--payload", payload, db=db)
    one_line_error(done, 2, "nests too deeply")


def test_a_job_id_beyond_bigint_is_a_usage_error(workdir: Path, db: str) -> None:
    done = run(workdir, "trace", "show", "99999999999999999999999", db=db)
    one_line_error(done, 2, "JOB_ID", "99999999999999999999999")


def test_a_missing_app_module_is_named(workdir: Path, db: str) -> None:
    done = run(workdir, "worker", "--app", "nosuchmodule:app", db=db)
    one_line_error(done, 2, "--app", "nosuchmodule")


def test_concurrency_zero_is_refused(workdir: Path, db: str) -> None:
    done = run(workdir, "worker", "--app", "userapp:app", "--concurrency", "0", db=db)
    one_line_error(done, 2, "--concurrency")


def test_replay_of_a_missing_job_exits_2_naming_it(workdir: Path, db: str) -> None:
    one_line_error(run(workdir, "replay", "424242", db=db), 2, "424242")


def test_diff_of_unknown_ids_exits_2_naming_them(workdir: Path, db: str) -> None:
    one_line_error(run(workdir, "diff", "xxx", "yyy", db=db), 2, "'xxx'")


def test_a_db_that_is_not_a_url_is_refused_and_creates_nothing(workdir: Path) -> None:
    one_line_error(run(workdir, "stats", db="not a url"), 2, "not a database URL")
    assert not (workdir / "not a url").exists()


def test_an_unreachable_database_exits_3_with_the_password_masked(workdir: Path) -> None:
    url = "postgresql://alice:hunter2@127.0.0.1:1/nothing"
    line = one_line_error(run(workdir, "stats", db=url), 3)
    assert "hunter2" not in line and "alice:***@" in line


def test_debug_shows_the_traceback(workdir: Path, db: str) -> None:
    done = run(workdir, "--debug", "replay", "424242", db=db)
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: no job with id 424242"


def test_the_default_database_is_announced_once_and_created_private(workdir: Path) -> None:
    first = run(workdir, "stats")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("creating the SQLite database") == 1
    assert str(workdir / "replayq.db") in first.stderr
    assert stat.S_IMODE((workdir / "replayq.db").stat().st_mode) == 0o600
    again = run(workdir, "stats")
    assert again.returncode == 0 and again.stderr == ""


def test_a_reader_that_went_away_is_no_internal_error(workdir: Path, db: str) -> None:
    """``replayq jobs list | head -1``: the reader's end is closed before a line is
    written here (a pipe with no reader), so every write fails as head's exit makes it."""
    enqueued = run(
        workdir, "enqueue", "echo", "--payload", '{"value": 1}', "--app", "userapp:app", db=db
    )
    assert enqueued.returncode == 0, enqueued.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [REPLAYQ, "--db", db, "jobs", "list"],
            cwd=workdir,
            env=user_env(workdir),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


CLOSING_APP_MODULE = """
import os
import sys

import replayq

app = replayq.App()


@app.job("echo")
def echo(ctx, value):
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "replayq.replay.worker_process":
        try:
            os.close(0)  # a dry-run worker process that stops reading its batches
        except OSError:
            pass
    with ctx.step("echo"):
        pass
    return value
"""


def test_a_broken_pipe_that_is_not_the_outputs_is_reported(workdir: Path, db: str) -> None:
    """``jobs dry-run --processes 2`` whose worker processes stop reading their input (one
    died): sending the next batch raises ``BrokenPipeError``. stdout is a file, whose reader
    never goes away; the command exited 141 without a word, its output cut at the progress
    bar, as if ``| head`` had closed it. It is one error line naming the worker process."""
    (workdir / "closer.py").write_text(CLOSING_APP_MODULE)
    env = user_env(workdir)
    enqueue = "import closer\nfor n in range(250):\n    closer.app.enqueue('echo', {'value': n})"
    subprocess.run(
        [sys.executable, "-c", enqueue],
        cwd=workdir,
        env={**env, "REPLAYQ_DB": db},
        check=True,
        timeout=60,
    )
    ran = run(workdir, "worker", "--app", "closer:app", "--burst", db=db)
    assert ran.returncode == 0, ran.stderr
    with (workdir / "out.txt").open("w") as out:
        done = subprocess.run(
            [REPLAYQ, "--db", db, "jobs", "dry-run", "--app", "closer:app", "--processes", "2"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    one_line_error(done, 2, "dry-run worker process", "unfinished")


@pytest.mark.parametrize(
    "url",
    [
        # A password libpq cannot decode: its error quotes the token, the password itself.
        "postgresql://nobody:s3cr%zzet@127.0.0.1:1/db",
        "postgresql://nobody:s3cr&et%@127.0.0.1:1/db",
        # A password given as a query parameter, which libpq takes as well as userinfo.
        "postgresql://nobody@127.0.0.1:1/db?password=s3cr%20et&connect_timeout=2",
    ],
)
def test_a_password_in_a_postgres_url_is_never_printed(tmp_path: Path, url: str) -> None:
    """Every error line masks a URL's password (``error: …``, "with any password in a URL
    masked"): libpq's own message about a URL it could not parse, and a ``?password=``,
    were printed as they came, the password in clear."""
    done = run(tmp_path, "jobs", "list", db=url)
    line = one_line_error(done, 3, "cannot connect to PostgreSQL")
    assert "s3cr" not in line, line
