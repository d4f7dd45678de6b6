"""The trace's verbs of the storage seam: ``trace_append`` and ``trace_query``.

Part of ``Transaction`` (``protocol.py``); implemented once in ``trace_verbs.TraceVerbs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, overload

from replayq.model import TraceEvent
from replayq.storage.context_params import TraceFence
from replayq.storage.params import JobTrace, TraceJobs, TraceQuery, TraceRead, TraceWindow


class TraceTransaction(Protocol):
    """The trace verbs of a ``Transaction``."""

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """Append ``events``; with ``fence`` only while it holds the lease (else ``False``)."""
        ...

    @overload
    def trace_query(self, params: TraceQuery) -> list[TraceEvent]: ...

    @overload
    def trace_query(self, params: TraceJobs) -> list[JobTrace]: ...

    @overload
    def trace_query(self, params: TraceWindow) -> list[tuple[TraceEvent, str, str | None]]: ...

    def trace_query(
        self, params: TraceRead
    ) -> list[TraceEvent] | list[JobTrace] | list[tuple[TraceEvent, str, str | None]]:
        """The events of a job, a trace or a resource (``TraceQuery``); of several jobs at
        once (``TraceJobs``); or ``(event, job type, version)`` of a time window, a page in
        HLC order (``TraceWindow``)."""
        ...
