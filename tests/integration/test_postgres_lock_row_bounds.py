"""Every statement that writes a lock's row bounds its wait for that row (PostgreSQL).

A commit that fences a write under a lock keeps the lock's row ``FOR SHARE`` until it ends,
and a worker frozen inside a commit in one round trip keeps it until it thaws or its
session ends. An acquisition already waited for it at most what was left of its ``wait``
(``test_postgres_lock_wait_bound.py``); ``replayq locks break``, the holder's renewal (the
heartbeat's) and a release on its own waited for as long as the holder stayed frozen.
Now each waits at most its bound (``lock_timeout``, set in its own statement) and fails
with ``RowLockTimeoutError`` saying what was not done and why; nothing changed, the
pooled connection goes back with the server's ``lock_timeout``, and once the holder is
gone the same call goes through.

The holder here is a real second session (psycopg, outside replayq) holding the row
``FOR SHARE`` as a fence does; a timer ends it after ``HOLD`` seconds, so that the code
before this change fails these tests (it returned only then) instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import replayq
import replayq.testing
from replayq.cli import main
from replayq.errors import RowLockTimeoutError
from replayq.storage import open_storage
from replayq.storage.commits import commit_at_once
from replayq.storage.context_params import LockAcquire, LockRelease, LockReleaseInTime, LockRenew
from replayq.storage.protocol import Lock, Storage, Transaction, lock_get

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0
BOUND = 0.5
HOLD = 4.0  # the holder's session ends then, whatever happens
MARGIN = 1.0  # what returning may take past the bound on a loaded machine


@contextmanager
def row_held(url: str, resource: str) -> Iterator[Callable[[], None]]:
    """A second session holding ``resource``'s lock row ``FOR SHARE`` (a fence's hold) until
    the block ends, the function it yields is called, or ``HOLD`` seconds passed."""
    holder = psycopg.connect(url)
    holder.execute("SELECT 1 FROM rq_locks WHERE resource = %s FOR SHARE", (resource,))
    ended = threading.Lock()

    def end() -> None:
        with ended:
            if not holder.closed:
                holder.rollback()
                holder.close()

    timer = threading.Timer(HOLD, end)
    timer.start()
    try:
        yield end
    finally:
        timer.cancel()
        end()


def _lock_timeout(storage: Storage) -> str:
    with storage.transaction() as tx:
        (setting,) = tx.connection.execute("SHOW lock_timeout").fetchone()
    return str(setting)


def _renew(tx: Transaction, wait: float | None) -> Any:
    return tx.lock_transition(LockRenew("res", "a", T0 + 5, 10.0, wait=wait))


def _release(tx: Transaction, wait: float | None) -> Any:
    return tx.lock_transition(LockRelease("res", "a", 11, wait=wait))


def _release_in_time(tx: Transaction, wait: float | None) -> Any:
    return tx.lock_transition(LockReleaseInTime("res", "a", T0 + 5, 11, wait=wait))


def _break(tx: Transaction, wait: float | None) -> Any:
    return tx.lock_transition(LockRelease("res", None, 11, wait=wait))


CHANGES = {
    "renewed": _renew,
    "released": _release,
    "released in time": _release_in_time,
    "broken": _break,
}


@pytest.mark.parametrize("at_once", [True, False], ids=["commit_at_once", "plain"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_of_a_lock_waits_for_its_held_row_no_longer_than_its_bound(
    pg_schema_url: str, change: str, at_once: bool
) -> None:
    storage = open_storage(f"{pg_schema_url}&pool_size=2&pool_timeout=2")
    storage.migrate(T0)
    do = CHANGES[change]
    try:
        default = _lock_timeout(storage)
        with storage.transaction() as tx:
            first = tx.lock_transition(LockAcquire("res", "a", None, "w-a", T0, 10.0, 1))
            before = lock_get(tx, "res")
        assert first is not None and before is not None
        with row_held(pg_schema_url, "res") as end_hold:
            asked = time.monotonic()
            with pytest.raises(RowLockTimeoutError):
                if at_once:  # a release on its own: in one round trip (refusals) first
                    commit_at_once(storage, lambda tx: do(tx, BOUND))
                else:
                    with storage.transaction() as tx:
                        do(tx, BOUND)
            waited = time.monotonic() - asked
            after = _row(storage)
            setting = _lock_timeout(storage)
            end_hold()
        assert BOUND <= waited < BOUND + MARGIN, (change, waited)
        assert setting == default, "lock_timeout left on the pooled connection"
        assert after == before, "nothing changed"
        # The holder gone, the same change goes through.
        with storage.transaction() as tx:
            assert do(tx, BOUND), change
    finally:
        storage.close()


def _row(storage: Storage) -> Lock | None:
    with storage.transaction() as tx:
        return lock_get(tx, "res")


@pytest.fixture
def app(pg_schema_url: str) -> Iterator[replayq.App]:
    app = replayq.App(pg_schema_url, auto_migrate=True)
    yield app
    app.close()


def _held_lock(app: replayq.App) -> None:
    """``res`` held by ``a`` for a minute, judged by the database's clock."""
    with app.storage.transaction() as tx:
        grant = tx.lock_transition(
            LockAcquire("res", "a", None, "w-a", app.clock.now(), 60.0, 1, database_clock=True)
        )
    assert grant is not None


def test_breaking_a_lock_whose_row_is_held_fails_after_its_wait_naming_the_lock(
    app: replayq.App, pg_schema_url: str
) -> None:
    _held_lock(app)
    with row_held(pg_schema_url, "res"):
        asked = time.monotonic()
        with pytest.raises(RowLockTimeoutError, match=r"lock 'res' not broken: its row stayed"):
            replayq.break_lock(app, "res", reason="frozen holder", wait=BOUND)
        waited = time.monotonic() - asked
        asked = time.monotonic()
        result = CliRunner().invoke(
            main,
            ["--db", pg_schema_url, "locks", "break", "res", "--reason", "r", "--wait", "0.5s"],
        )
        cli_waited = time.monotonic() - asked
    assert BOUND <= waited < BOUND + MARGIN, waited
    # Exit 3 (storage unavailable: try again later), the lock named, well before the hold ends.
    assert result.exit_code == 3, result.output
    assert "lock 'res' not broken" in result.output, result.output
    assert cli_waited < BOUND + 2 * MARGIN, cli_waited
    (held,) = replayq.list_locks(app)
    assert held.resource == "res" and held.owner_token is not None, "nothing broken"
    broken = replayq.break_lock(app, "res", reason="holder gone", wait=BOUND)
    assert broken is not None


def test_a_holders_renewal_and_release_fail_after_their_bound_naming_the_lock(
    app: replayq.App, pg_schema_url: str
) -> None:
    """In a job: ``ctx.lock(wait=…)`` taken; a second session then holds the lock's row.
    The heartbeat's renewal (``Context.renew_locks``) and a release on its own (what the
    ``with``'s end calls: ``LockManager.release``) each fail after the lock's wait, naming
    the lock, and nothing of them changed; the handler goes on."""
    seen: dict[str, Any] = {}

    @app.job("hold", lease="30s", heartbeat="10s")
    def hold(ctx: replayq.Context) -> None:
        # The ``with``'s own release comes after the second session ended: it goes through.
        with ctx.lock("res", ttl="60s", wait=f"{BOUND}s"), row_held(pg_schema_url, "res"):
            asked = time.monotonic()
            try:
                ctx.renew_locks()
            except RowLockTimeoutError as exc:
                seen["renewal"] = (time.monotonic() - asked, str(exc))
            asked = time.monotonic()
            try:
                ctx.locks.release(ctx.locks.held["res"])
            except RowLockTimeoutError as exc:
                seen["release"] = (time.monotonic() - asked, str(exc))

    job = replayq.testing.run_inline(app, "hold", {})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    assert set(seen) == {"renewal", "release"}, seen
    for what, (waited, message) in seen.items():
        assert BOUND <= waited < BOUND + MARGIN, (what, waited)
        done = "renewed" if what == "renewal" else "released"
        assert f"lock 'res' not {done}: its row stayed locked" in message, message
