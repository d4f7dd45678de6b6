"""``report``, the storage seam's verb for the operators' questions (``reports.py``).

Part of ``Transaction`` (``protocol.py``); implemented once in ``report_verbs.ReportVerbs``.
"""

from __future__ import annotations

from typing import Protocol, overload

from replayq.model import StatRow
from replayq.storage.records import (
    JobGauge,
    OrderBreak,
    OutboxBacklog,
    SignalBucket,
    VersionOutcome,
)
from replayq.storage.reports import (
    JobCount,
    JobDurations,
    JobGauges,
    JobsScheduled,
    JobStats,
    OutboxPending,
    OutOfOrder,
    ReportQuery,
    SignalCounts,
    SignalSeries,
    VersionOutcomes,
)


class ReportTransaction(Protocol):
    """The ``report`` verb of a ``Transaction``: one overload per question."""

    @overload
    def report(self, query: JobStats) -> list[StatRow]: ...

    @overload
    def report(self, query: JobCount) -> int: ...

    @overload
    def report(self, query: JobGauges) -> list[JobGauge]: ...

    @overload
    def report(self, query: JobsScheduled) -> tuple[int, float | None]: ...

    @overload
    def report(self, query: JobDurations) -> list[float]: ...

    @overload
    def report(self, query: OutOfOrder) -> list[OrderBreak]: ...

    @overload
    def report(self, query: VersionOutcomes) -> list[VersionOutcome]: ...

    @overload
    def report(self, query: SignalCounts) -> list[tuple[str, str, int]]: ...

    @overload
    def report(self, query: SignalSeries) -> list[SignalBucket]: ...

    @overload
    def report(self, query: OutboxPending) -> OutboxBacklog: ...

    def report(self, query: ReportQuery) -> object:
        """Answer one of the operators' questions (``storage/reports.py`` lists them)."""
        ...
