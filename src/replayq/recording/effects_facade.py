"""The ``App``'s methods over the idempotency ledger: list effects, settle in-doubt ones.

``App`` inherits ``EffectsFacade``; the methods stay its public API
(``app.effects_in_doubt``, ``app.resolve_effect``…), written over the runtime
with ``in_doubt.py``'s functions.
"""

from __future__ import annotations

from typing import Any

from replayq.queue.inspection import os_user
from replayq.recording.in_doubt import (
    EffectRecord,
    EffectResolution,
    list_effects,
    reconcile_effects,
    resolve_effect,
)
from replayq.runtime import Runtime


class EffectsFacade:
    """Effect records (the idempotency ledger) and the settling of in-doubt ones."""

    runtime: Runtime

    def effects(
        self, *, in_doubt: bool = False, kind: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        """Effect records (idempotency ledger), newest first; ``in_doubt`` for the unsettled."""
        return list_effects(self.runtime, in_doubt=in_doubt, kind=kind, limit=limit)

    def effects_in_doubt(self, *, kind: str | None = None) -> list[EffectRecord]:
        """Effects started by an attempt that ended without recording their outcome."""
        return list_effects(self.runtime, in_doubt=True, kind=kind, limit=10_000)

    def resolve_effect(
        self,
        key: str,
        *,
        succeeded: bool,
        result: Any = None,
        reason: str | None = None,
        by: str | None = None,
    ) -> EffectRecord:
        """Settle an in-doubt effect; then ``requeue`` its parked job to continue.

        ``succeeded=True``: the job's next attempt gets ``result`` from the ledger
        without calling the effect. ``succeeded=False``: it calls the effect again.
        ``by`` (default: the OS user) and ``reason`` go into the trace.
        """
        return resolve_effect(
            self.runtime, key, succeeded=succeeded, result=result, reason=reason, by=by or os_user()
        )

    def reconcile_effects(
        self, *, kind: str | None = None, by: str | None = None
    ) -> list[tuple[EffectRecord, EffectResolution | None, str | None]]:
        """Ask each in-doubt effect's reconciler; settle those it knows (see ``reconciler``)."""
        return reconcile_effects(self.runtime, kind=kind, by=by or f"reconciler ({os_user()})")
