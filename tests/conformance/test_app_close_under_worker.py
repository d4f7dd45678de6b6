"""``App.close()`` while a worker of that app runs in the same process (a web app's
shutdown hook, a test's teardown, a script that closes its app with its worker thread still
finishing): docs/reliability.md, "A storage used after close()".

The app opens its storage again at its next use, so the worker goes on; what its
transactions in flight at each close met must not be taken for the jobs' failures. Before,
a handler's step commit that met the closed storage (``StorageError``: "this storage is
closed") failed its attempt, class ``unknown``, and with the default retry policy the job
went to ``dead``: 1 to 4 jobs of these 200 on SQLite, 14 to 19 on PostgreSQL.

A real process (the closes race real statements; a crash there would be a signal, not a
test failure of this one): its main thread closes the app every 20 ms while a ``Worker``
of that app drains jobs whose handler writes an entity in a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_postgres

ROOT = Path(__file__).resolve().parents[2]

CLOSER = """
import collections, json, sys, threading, time
import replayq

app = replayq.App(sys.argv[1], auto_migrate=True)
total = int(sys.argv[2])


@app.job("tick", lease="5s", heartbeat="1s")
def tick(ctx: replayq.Context, n: int) -> None:
    with ctx.step("write"):
        ctx.state.put("tick", n, {"n": n}, expected_version=0)
    time.sleep(0.01)


for n in range(total):
    app.enqueue("tick", {"n": n})
worker = replayq.Worker(app, concurrency=2, poll_interval=0.05, grace_period=5)
thread = threading.Thread(target=worker.run)
thread.start()
closes = 0
deadline = time.monotonic() + 60
states = collections.Counter()
while time.monotonic() < deadline:
    time.sleep(0.02)
    app.close()  # while the worker's threads are inside their transactions
    closes += 1
    states = collections.Counter(j.state.value for j in app.list_jobs(limit=total + 1))
    if states["succeeded"] + states["dead"] == total:
        break
worker.stop()
thread.join(30)
states = collections.Counter(j.state.value for j in app.list_jobs(limit=total + 1))
versions = collections.Counter(app.state.get("tick", n).version for n in range(total))
print(json.dumps({"closes": closes, "states": states, "versions": versions,
                  "alive": thread.is_alive()}))
app.close()
"""


@pytest.mark.timeout(120)
def test_closing_an_app_while_its_worker_runs_fails_no_job(db_url: str) -> None:
    if db_url.startswith("postgresql"):
        require_postgres()
    total = 200
    python_path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", CLOSER, db_url, str(total)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, f"the process ended {done.returncode}\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["closes"] >= 20, f"the app was closed under the worker only {report}"
    assert not report["alive"], "the worker ended when stopped"
    assert report["states"] == {"succeeded": total}, (
        f"{report['states']}: a close failed jobs\n{done.stderr[-3000:]}"
    )
    # Each job's step committed its write once: version 1, never a second attempt's on top.
    assert report["versions"] == {"1": total}, report["versions"]


EFFECT_CLOSER = """
import json, sqlite3, sys, threading, time
import replayq

path = sys.argv[1]
app = replayq.App(path, auto_migrate=True)
sent = []


@app.job("mail", lease="10s", heartbeat="1s")
def mail(ctx: replayq.Context, n: int) -> None:
    def send() -> str:
        sent.append(n)
        # The effect has happened. Another writer holds the file's write lock while the
        # effect's record waits for it (1 s, within busy_timeout); the app is closed then.
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")

        def later() -> None:
            time.sleep(0.5)
            app.close()
            time.sleep(0.5)
            blocker.execute("ROLLBACK")
            blocker.close()

        threading.Thread(target=later).start()
        return "sent"

    ctx.effect("email", send, key=f"mail-{n}")


app.enqueue("mail", {"n": 1})
worker = replayq.Worker(app, poll_interval=0.05, grace_period=5, burst=True)
thread = threading.Thread(target=worker.run)
thread.start()
thread.join(60)
[job] = app.list_jobs(limit=5)
print(json.dumps({"state": job.state.value, "sent": sent, "error": job.last_error,
                  "alive": thread.is_alive()}))
app.close()
"""


@pytest.mark.timeout(120)
def test_an_effect_done_as_the_app_closes_is_recorded_not_left_in_doubt(tmp_path: Path) -> None:
    """The effect ran; its record's transaction, waiting for SQLite's write lock, met the
    close. Before, that record was not tried again (only an outage was): the attempt was
    put back with the key still ``started``, and the next attempt found the effect in doubt
    and parked the job in ``dead`` (policy ``park``), though the effect had succeeded.
    SQLite only: the close is timed by the write lock another connection holds."""
    path = str(tmp_path / "effect.db")
    python_path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", EFFECT_CLOSER, path],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, f"the process ended {done.returncode}\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["alive"], report
    assert report["sent"] == [1], report  # the effect ran once, never again
    assert report["state"] == "succeeded", f"{report}\n{done.stderr[-3000:]}"


CLOSED_FOR_GOOD = """
import json, sys, threading
import replayq
from replayq.storage import open_storage

path = sys.argv[1]
app = replayq.App(path, auto_migrate=True)
audit_log = open_storage(path + ".audit")  # a storage of the handler's own
audit_log.close()  # closed for good: nothing opens it again


def audit(connection) -> None:
    with audit_log.transaction():
        pass


@app.job("audited", lease="5s", heartbeat="1s")
def audited(ctx: replayq.Context, n: int) -> None:
    ctx.db_write(audit)  # runs at the ack


app.enqueue("audited", {"n": 1})
worker = replayq.Worker(app, poll_interval=0.05, grace_period=2, burst=True)
thread = threading.Thread(target=worker.run, daemon=True)
thread.start()
thread.join(30)
[job] = app.list_jobs(limit=5)
print(json.dumps({"alive": thread.is_alive(), "state": job.state.value, "error": job.last_error}))
"""


@pytest.mark.timeout(120)
def test_an_ack_meeting_a_storage_closed_for_good_fails_its_attempt_not_retried_forever(
    tmp_path: Path,
) -> None:
    """A ``StorageClosedError`` at a group commit is taken for the app's storage closed
    under the worker, which the next try opens anew: tried again whole, never split nor
    given up. One that no try gets past (a ``ctx.db_write`` function's own storage, closed
    for good) held the job ``running`` and its slot taken for as long as the worker ran,
    its retries debug records: a burst run never ended. After five tries in a row it is
    the attempt's failure, with the error saying the storage is closed."""
    path = str(tmp_path / "acks.db")
    python_path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", CLOSED_FOR_GOOD, path],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, f"the process ended {done.returncode}\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["alive"], f"the burst run never ended: {report}"
    assert report["state"] == "dead", report
    assert "StorageClosedError" in report["error"] and "storage is closed" in report["error"]
