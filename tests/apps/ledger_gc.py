"""``tests.apps.retained``'s jobs with a ledger that ends: ``Retention(full_days=1,
ledger_days=3)``, so that ``replayq gc --app tests.apps.ledger_gc:app`` deletes jobs past
their fourth day and drops their day's ledger partition (PostgreSQL)."""

from __future__ import annotations

import replayq
from tests.apps.retained import declare

RETENTION = replayq.Retention(full_days=1, ledger_days=3)

app = declare(replayq.App(retention=RETENTION))
