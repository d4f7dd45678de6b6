"""A lock whose release waited for a settle that gave up is released when the attempt ends.

``ship`` (``tests/apps/lock_abandoned.py``) lets go of its lock while its writes wait for
the ack; run on its own (``run_inline``: no group commit, the ack is a settle), the ack
is refused for real every time (the application's insert names a column its table does
not have yet: neither a constraint, which would fail the attempt at once, nor an
outage), the settle gives up after its tries and the job stays running, to be reaped.
The lock must be free then, not held for its 60 s TTL: ``take`` gets it without waiting.
(``tests/acceptance/test_lock_release_abandoned.py`` is the same through a worker's
group commit, with real worker processes.)
"""

from __future__ import annotations

from collections.abc import Callable

import replayq
from replayq.storage.protocol import lock_get
from replayq.testing import run_inline
from tests.apps import lock_abandoned


def test_a_release_waiting_for_a_settle_given_up_is_made_when_the_attempt_ends(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = lock_abandoned.register(app_factory())
    lock_abandoned.create_table(app)

    shipped = run_inline(app, "ship", {"order": 1})

    assert shipped.state is replayq.JobState.RUNNING, "the ack was given up"
    with app.storage.transaction(readonly=True) as tx:
        row = lock_get(tx, lock_abandoned.SHELF)
    assert row is not None and row.owner_token is None, row
    events = [(e.name, e.resource) for e in app.trace(shipped.id) if e.name.startswith("lock.")]
    assert events == [("lock.acquired", "shelf:1"), ("lock.released", "shelf:1")], events
    assert app.state.get("order", 1).version == 0, "the refused ack wrote nothing"

    taken = run_inline(app, "take", {"wait": 0.0})
    assert (taken.state, taken.last_error) == (replayq.JobState.SUCCEEDED, None)
