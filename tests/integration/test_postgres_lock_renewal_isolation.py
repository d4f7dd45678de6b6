"""One job's lock whose row another transaction holds does not stop the heartbeat from
renewing the other jobs' locks (PostgreSQL).

The heartbeat renews each running job's locks after it extends the leases
(``Heartbeat._extend``). A renewal whose lock row another transaction holds (a commit
fenced under the lock, a worker frozen inside one) fails after its bound with
``RowLockTimeoutError``. That error ended the loop over the flights: every job after the
stuck one in the worker's flights got no lock renewal at any beat, and its locks ran out
under its running handler (another worker could take them; its writes then fenced); a
held job being started after a stall (``_renew_before_start``) was dropped unrun,
although its own lease had just been extended. Now the stuck renewal is logged and the
others go on.

The holder is a real second session holding the stuck lock's row ``FOR SHARE``, as a
fence does; the jobs wait on events the test sets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

import replayq
from replayq.storage.protocol import lock_get

pytestmark = pytest.mark.postgres

TTL = 2.0  # the second job's lock: it runs out unless the heartbeat renews it


@pytest.fixture
def app(pg_schema_url: str) -> Iterator[replayq.App]:
    app = replayq.App(pg_schema_url, auto_migrate=True)
    yield app
    app.close()


def _expires_in(app: replayq.App, resource: str) -> float:
    with app.storage.transaction() as tx:
        lock = lock_get(tx, resource)
        (now,) = tx.connection.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    assert lock is not None and lock.owner_token is not None, resource
    assert lock.expires_at is not None
    return float(lock.expires_at) - float(now)


def test_a_stuck_lock_row_of_one_job_leaves_the_other_jobs_locks_renewed(
    app: replayq.App, pg_schema_url: str
) -> None:
    held = {"stuck": threading.Event(), "fine": threading.Event()}
    done = threading.Event()

    @app.job("hold", lease="30s", heartbeat="0.2s")
    def hold(ctx: replayq.Context, name: str, ttl: float) -> None:
        with ctx.lock(f"res-{name}", ttl=f"{ttl}s"):
            held[name].set()
            assert done.wait(60), "the test never let the job end"

    # The stuck job first: its flight comes before the other's in the worker's.
    app.enqueue("hold", {"name": "stuck", "ttl": 30.0})
    app.enqueue("hold", {"name": "fine", "ttl": TTL})
    worker = replayq.Worker(app, concurrency=2, poll_interval=0.02, grace_period=10)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    holder = None
    try:
        assert held["stuck"].wait(20) and held["fine"].wait(20), "the locks were never taken"
        holder = psycopg.connect(pg_schema_url)
        holder.execute("SELECT 1 FROM rq_locks WHERE resource = 'res-stuck' FOR SHARE")
        time.sleep(TTL + 1.5)  # beats every 0.2 s: the fine lock renewed many times over
        left = _expires_in(app, "res-fine")
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
        done.set()
        worker.stop()
        runner.join(20)
    assert left > TTL / 2, f"the other job's lock ran out under it ({left:.2f}s left)"


def test_a_stuck_lock_row_leaves_the_same_jobs_other_locks_renewed(
    app: replayq.App, pg_schema_url: str
) -> None:
    """One job holding two locks, the first one's row held by another session: the
    heartbeat's renewal of both, one transaction, was rolled back at every beat by the
    stuck one, and the second lock ran out under the job too."""
    taken, done = threading.Event(), threading.Event()

    @app.job("both", lease="30s", heartbeat="0.2s")
    def both(ctx: replayq.Context) -> None:
        with ctx.lock("res-stuck", ttl="30s"), ctx.lock("res-fine", ttl=f"{TTL}s"):
            taken.set()
            assert done.wait(60), "the test never let the job end"

    app.enqueue("both", {})
    worker = replayq.Worker(app, poll_interval=0.02, grace_period=10)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    holder = None
    try:
        assert taken.wait(20), "the locks were never taken"
        holder = psycopg.connect(pg_schema_url)
        holder.execute("SELECT 1 FROM rq_locks WHERE resource = 'res-stuck' FOR SHARE")
        time.sleep(TTL + 1.5)
        left = _expires_in(app, "res-fine")
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
        done.set()
        worker.stop()
        runner.join(20)
    assert left > TTL / 2, f"the job's other lock ran out under it ({left:.2f}s left)"
