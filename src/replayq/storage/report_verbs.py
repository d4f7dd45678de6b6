"""``Transaction.report``: the operators' questions (``reports.py``), implemented once.

A mixin over ``SqlTransaction``'s plumbing, like ``context_verbs.ContextVerbs``; each
question's SQL is a named query in the backends' ``jobs.sql``, ``window.sql`` and
``outbox.sql``. ``report`` dispatches on the question's class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from replayq.model import StatRow
from replayq.storage.context_verbs import record
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
from replayq.storage.sql_statements import SqlStatements


def by_state(query: str, states: Sequence[str] | None) -> str:
    """``job_list`` / ``job_count``, or their ``_by_state`` form when only states kept in
    a partial index (queued, running, dead, cancelled) are asked for: those never read
    the history of succeeded jobs."""
    if states is None or "succeeded" in states:
        return query
    return {"job_list": "job_list_by_state", "job_count": "job_count_by_state"}[query]


class ReportVerbs(SqlStatements):
    """The ``report`` verb, shared by every SQL backend."""

    def report(self, query: ReportQuery) -> Any:
        answer: Callable[[ReportVerbs, Any], Any] = _ANSWERS[type(query)]
        return answer(self, query)

    def _job_stats(self, query: JobStats) -> list[StatRow]:
        return [
            StatRow(r["job_type"], r["state"], int(r["count"]), r["oldest_run_at"])
            for r in self.fetchall("job_stats")
        ]

    def _job_count(self, query: JobCount) -> int:
        where = query.filter
        row = self.fetchone(
            by_state("job_count", where.states),
            {
                "states": self.list_param(where.states),
                "job_type": where.job_type,
                "origin": where.origin,
                "version": where.version,
            },
        )
        assert row is not None
        return int(row["count"])

    def _job_gauges(self, query: JobGauges) -> list[JobGauge]:
        return [record(JobGauge, r) for r in self.fetchall("job_gauges", {"now": query.now})]

    def _jobs_scheduled(self, query: JobsScheduled) -> tuple[int, float | None]:
        values = {"now": query.now, "queues": self.list_param(query.queues)}
        row = self.fetchone("job_scheduled", values)
        assert row is not None
        return int(row["count"]), row["next_run_at"]

    def _job_durations(self, query: JobDurations) -> list[float]:
        values = {"job_type": query.job_type, "version": query.version}
        rows = self.fetchall("job_durations", values)
        return [float(r["duration"]) for r in rows if r["duration"] is not None]

    def _out_of_order(self, query: OutOfOrder) -> list[OrderBreak]:
        return [record(OrderBreak, r) for r in self.fetchall("job_out_of_order")]

    def _version_outcomes(self, query: VersionOutcomes) -> list[VersionOutcome]:
        values = {"job_type": query.job_type, "since": query.since}
        rows = self.fetchall("version_outcomes", values)
        # SQLite's json_extract gives 1/0 for a JSON boolean, PostgreSQL a boolean.
        return [
            record(VersionOutcome, {**r, "stale": None if r["stale"] is None else bool(r["stale"])})
            for r in rows
        ]

    def _signal_counts(self, query: SignalCounts) -> list[tuple[str, str, int]]:
        values = {"names": self.list_param(query.names), "since": query.since}
        rows = self.fetchall("signal_counts", values)
        return [(r["job_type"], r["name"], int(r["count"])) for r in rows]

    def _signal_series(self, query: SignalSeries) -> list[SignalBucket]:
        values = {
            "names": self.list_param(query.names),
            "since_hlc": query.since_hlc,
            "until_hlc": query.until_hlc,
            "bucket_ms": query.bucket_ms,
        }
        return [record(SignalBucket, r) for r in self.fetchall("signal_series", values)]

    def _outbox_pending(self, query: OutboxPending) -> OutboxBacklog:
        row = self.fetchone("outbox_backlog")
        assert row is not None
        return OutboxBacklog(int(row["pending"]), row["oldest"])


_ANSWERS: dict[type[Any], Callable[[ReportVerbs, Any], Any]] = {
    JobStats: ReportVerbs._job_stats,
    JobCount: ReportVerbs._job_count,
    JobGauges: ReportVerbs._job_gauges,
    JobsScheduled: ReportVerbs._jobs_scheduled,
    JobDurations: ReportVerbs._job_durations,
    OutOfOrder: ReportVerbs._out_of_order,
    VersionOutcomes: ReportVerbs._version_outcomes,
    SignalCounts: ReportVerbs._signal_counts,
    SignalSeries: ReportVerbs._signal_series,
    OutboxPending: ReportVerbs._outbox_pending,
}
