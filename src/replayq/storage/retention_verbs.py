"""The retention verbs (``keep_transition``, ``gc_scan``, ``gc_apply``), implemented once.

A mixin over ``SqlTransaction``'s plumbing, like ``report_verbs.ReportVerbs``; the SQL
is in the backends' ``retention.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from replayq.model import TraceEvent
from replayq.storage import packs
from replayq.storage.context_verbs import query_params, record
from replayq.storage.records import (
    BlobCandidate,
    DerivedCandidate,
    GcAnswer,
    GcCandidate,
    JobHour,
    KeepRecord,
)
from replayq.storage.retention_params import (
    BlobPurge,
    BlobScan,
    DerivedPurge,
    DerivedScan,
    GcChange,
    GcCursor,
    GcCursorPut,
    GcQuery,
    GcScan,
    IdemPurge,
    JobHours,
    JobPurge,
    KeepChange,
    KeepHold,
    KeepPin,
    KeptJobs,
    MessageIdForget,
    TraceTrim,
)


class RetentionVerbs:
    """Pins and holds, gc's questions and its deletions, shared by every SQL backend."""

    def list_param(self, values: Sequence[str] | Sequence[int] | None) -> Any:
        raise NotImplementedError

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        raise NotImplementedError

    def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        raise NotImplementedError

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    # -- retention ------------------------------------------------------------------------

    def keep_transition(self, change: KeepChange) -> bool:
        if isinstance(change, KeepPin):
            # The job's lock first, as a hold takes it: a gc trimming or deleting the job
            # right now commits before the pin (which then finds the job, or not), and a
            # gc that comes after sees the pin.
            if self.fetchone("gc_hold_lock", {"job_id": change.job_id}) is None:
                return False
            self.execute("job_keep", query_params(change))
            return True
        if isinstance(change, KeepHold):
            if self.fetchone("gc_hold_lock", {"job_id": change.job_id}) is None:
                return False
            self.execute("gc_hold_put", query_params(change))
            return True
        return self.changed("gc_hold_delete", {"holder": change.holder})

    @overload
    def gc_scan(self, query: KeptJobs) -> list[KeepRecord]: ...
    @overload
    def gc_scan(self, query: GcScan) -> list[GcCandidate]: ...
    @overload
    def gc_scan(self, query: GcCursor) -> int: ...
    @overload
    def gc_scan(self, query: JobHours) -> list[JobHour]: ...
    @overload
    def gc_scan(self, query: DerivedScan) -> list[DerivedCandidate]: ...
    @overload
    def gc_scan(self, query: BlobScan) -> list[BlobCandidate]: ...
    def gc_scan(self, query: GcQuery) -> GcAnswer:
        if isinstance(query, KeptJobs):
            return [record(KeepRecord, r) for r in self.fetchall("keep_list")]
        if isinstance(query, GcScan):
            return [
                record(GcCandidate, r) for r in self.fetchall("gc_candidates", query_params(query))
            ]
        if isinstance(query, GcCursor):
            row = self.fetchone("gc_cursor", {"name": query.name})
            return int(row["cursor"]) if row is not None else 0
        if isinstance(query, JobHours):
            return [record(JobHour, r) for r in self.fetchall("job_hours", query_params(query))]
        if isinstance(query, DerivedScan):
            values = {
                "after_at": query.after[0],
                "after_id": query.after[1],
                "cutoff": query.cutoff,
                "limit": query.limit,
                "now": query.now,
            }
            return [record(DerivedCandidate, r) for r in self.fetchall("gc_derived", values)]
        rows = self.fetchall("gc_blobs", query_params(query))
        return [record(BlobCandidate, r) for r in rows]

    def gc_apply(self, change: GcChange) -> int:
        if isinstance(change, TraceTrim):
            return 0 if self._held(change.job_id, change.now) else self._trim(change)
        if isinstance(change, JobPurge):
            if self._held(change.job_id, change.now):
                return 0
            self.execute("job_hours_add", {"job_id": change.job_id})
            rows = self.fetchall("trace_for_job", {"job_id": change.job_id})
            self._resources_delete([(row["id"], packs.unpack(row)) for row in rows])
            self.execute("job_trace_delete", {"job_id": change.job_id})
            self.execute("job_steps_delete", {"job_id": change.job_id})
            self.execute("job_delete", {"job_id": change.job_id})
            return 1
        if isinstance(change, IdemPurge):
            return int(self.execute("idem_purge", {"job_id": change.job_id}).rowcount)
        if isinstance(change, MessageIdForget):
            return int(self.execute("job_message_forget", {"job_id": change.job_id}).rowcount)
        if isinstance(change, DerivedPurge):
            return self._derived_purge(change)
        if isinstance(change, BlobPurge):
            values = {"hashes": self.list_param(list(change.hashes)), "before": change.before}
            return int(self.execute("blob_purge", values).rowcount)
        if isinstance(change, GcCursorPut):
            self.execute("gc_cursor_put", query_params(change))
            return 0
        self.fetchall("gc_vacuum")
        return 0

    def _held(self, job_id: int, now: float) -> bool:
        """Lock the finished job gc is about to change; whether it is gone, no longer
        finished, or held by a live fork or dry-run (then gc leaves it alone)."""
        if self.fetchone("gc_job_lock", {"job_id": job_id}) is None:
            return True
        return self.fetchone("gc_held", {"job_id": job_id, "now": now}) is not None

    def _trim(self, change: TraceTrim) -> int:
        rows = self.fetchall("trace_for_job", {"job_id": change.job_id})
        unpacked = [(row, packs.unpack(row)) for row in rows]
        everything = sorted(
            (e for _, events in unpacked for e in events), key=lambda e: (e.hlc, e.id or 0)
        )
        kept = {e.id: e for e in change.keep(everything)}
        for row, events in unpacked:
            now_events = [kept[e.id] for e in events if e.id in kept]
            if now_events == events:
                continue
            pack_id = row["id"]
            self._resources_delete([(pack_id, events)])
            if not now_events:
                self.execute("trace_pack_delete", {"id": pack_id})
                continue
            packed = packs.pack_row(now_events)
            self.execute("trace_pack_rewrite", {**packed, "id": pack_id})
            entries = packs.pack_resources(now_events, pack_id)
            if entries:
                self.executemany("trace_resources_append", entries)
        return len(everything) - len(kept)

    def _resources_delete(self, found: Sequence[tuple[int, Sequence[TraceEvent]]]) -> None:
        """Delete the resource index entries of these packs by primary key: one per resource
        and HLC of their events (a superset of what was written: a pack migrated from the
        per-event trace has an entry per event)."""
        entries = {
            (e.resource, e.hlc, pack_id)
            for pack_id, events in found
            for e in events
            if e.resource is not None
        }
        if entries:
            self.executemany(
                "trace_resource_delete",
                [{"resource": r, "hlc": h, "pack_id": p} for r, h, p in sorted(entries)],
            )

    def _derived_purge(self, change: DerivedPurge) -> int:
        row = self.fetchone("gc_derived_lock", {"trace_id": change.trace_id})
        if row is None:
            return 0
        source = row["source_job_id"]
        if source is not None and self.fetchone(
            "gc_held_derived", {"source_job_id": source, "now": change.now}
        ):
            return 0
        rows = self.fetchall("trace_for_trace", {"trace_id": change.trace_id})
        self._resources_delete(
            [(row["id"], packs.unpack(row)) for row in rows if row["job_id"] is None]
        )
        self.execute("derived_trace_delete", {"trace_id": change.trace_id})
        branch = row["branch"]
        if branch:
            for query in ("branch_versions_delete", "branch_entities_delete", "branch_delete"):
                self.execute(query, {"branch": branch})
        self.execute("lineage_delete", {"trace_id": change.trace_id})
        return 1
