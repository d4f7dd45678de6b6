"""An acquisition's bound on its wait for the lock's row (``LockAcquire.wait``, PostgreSQL's
``lock_timeout`` local to its transaction): a commit holding the row ``FOR SHARE`` (a
write's fence) makes it fail with ``RowLockTimeoutError`` after the bound, not when that
commit ends; the connection goes back to the pool as it came (the setting gone with the
transaction), and nothing was granted."""

from __future__ import annotations

import time

import pytest

from replayq.errors import RowLockTimeoutError
from replayq.storage import open_storage
from replayq.storage.commits import commit_at_once
from replayq.storage.context_params import LockAcquire, LockFilter
from replayq.storage.protocol import lock_get

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0
BOUND = 0.3


@pytest.mark.parametrize("at_once", [True, False], ids=["commit_at_once", "plain"])
@pytest.mark.parametrize("refusals", [True, False], ids=["one-round-trip", "careful"])
def test_an_acquisition_waits_for_a_fenced_row_no_longer_than_its_bound(
    pg_schema_url: str, refusals: bool, at_once: bool
) -> None:
    # Two connections: the fenced commit holds one, the acquisition must give the other
    # back (a third transaction below gets it, or the pool's timeout fails the test).
    storage = open_storage(f"{pg_schema_url}&pool_size=2&pool_timeout=2")
    storage.migrate(T0)
    try:
        with storage.transaction() as tx:
            first = tx.lock_transition(LockAcquire("res", "a", None, "w-a", T0, 10.0, 1))
            (default,) = tx.connection.execute("SHOW lock_timeout").fetchone()
        assert first is not None
        take = LockAcquire("res", "b", None, "w-b", T0 + 100, 10.0, 2, wait=BOUND)
        with storage.transaction() as fenced, fenced.pipelined(refusals=refusals):
            assert fenced.lock_list(LockFilter("res", newer_than=first.fencing_token)) == []
            assert lock_get(fenced, "res") is not None  # the fence has run in the server
            asked = time.monotonic()
            with pytest.raises(RowLockTimeoutError):
                if at_once:  # as ``ctx.lock`` asks it: in a pipeline (``SET LOCAL`` queued)
                    commit_at_once(storage, lambda tx: tx.lock_transition(take))
                else:  # out of one (``lock_wait_bound``)
                    with storage.transaction() as tx:
                        tx.lock_transition(take)
            waited = time.monotonic() - asked
            with storage.transaction() as tx:
                (setting,) = tx.connection.execute("SHOW lock_timeout").fetchone()
                row = lock_get(tx, "res")
        assert BOUND <= waited < BOUND + 1.0, waited
        assert setting == default, "lock_timeout left on the pooled connection"
        assert row is not None and row.owner_token == "a", "nothing granted"
        # Once the fenced commit ended, the same acquisition goes through.
        with storage.transaction() as tx:
            grant = tx.lock_transition(take)
        assert grant is not None and grant.fencing_token == first.fencing_token + 1
    finally:
        storage.close()
