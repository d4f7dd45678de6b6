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
from replayq.storage.pack_dictionaries import PackDictionaries
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
    GcCount,
    GcCursor,
    GcCursorPut,
    GcHighestId,
    GcQuery,
    GcScan,
    IdemPurge,
    JobHours,
    JobPurge,
    KeepChange,
    KeepHold,
    KeepPin,
    KeptJobs,
    LedgerDrop,
    LedgerDropped,
    LedgerPartitions,
    MessageIdForget,
    TraceTrim,
)
from replayq.storage.sql_statements import SqlStatements


class RetentionVerbs(SqlStatements):
    """Pins and holds, gc's questions and its deletions, shared by every SQL backend."""

    # Whether the ledger tier lives in day partitions that gc drops (PostgreSQL).
    ledger_partitioned = False
    # The learned dictionaries of format 5 packs (``SqlTransaction.pack_dictionaries``).
    pack_dictionaries: PackDictionaries | None

    # -- retention ------------------------------------------------------------------------

    def keep_transition(self, change: KeepChange) -> bool:
        if isinstance(change, KeepPin):
            # The job's lock first, as a hold takes it: a gc trimming or deleting the job
            # right now commits before the pin (which then finds the job, or not), and a
            # gc that comes after sees the pin.
            if self.fetchone("gc_hold_lock", {"job_id": change.job_id}) is None:
                return False
            self.execute("job_keep", query_params(change))
            self._unmove(change.job_id)
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
    def gc_scan(self, query: GcHighestId) -> int: ...
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
        if isinstance(query, GcHighestId):
            row = self.fetchone("gc_highest_id", {})
            return int(row["high"]) if row is not None and row["high"] is not None else 0
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
        # The keys are stored as bytes (migration 0026); the hex of references here.
        values = {
            "after": bytes.fromhex(query.after),
            "before": query.before,
            "limit": query.limit,
        }
        rows = self.fetchall("gc_blobs", values)
        return [BlobCandidate(bytes(r["hash"]).hex(), r["stored_size"]) for r in rows]

    @overload
    def gc_apply(self, change: GcCount) -> int: ...
    @overload
    def gc_apply(self, change: LedgerDrop) -> LedgerDropped: ...
    def gc_apply(self, change: GcChange) -> int | LedgerDropped:
        if isinstance(change, TraceTrim):
            return self._trim(change)
        if isinstance(change, JobPurge):
            return self._purge(change)
        if isinstance(change, IdemPurge):
            if not change.job_ids:
                return 0
            return int(self.execute("idem_purge", self._id_list(change.job_ids)).rowcount)
        if isinstance(change, MessageIdForget):
            values = {"job_ids": self.list_param(list(change.job_ids))}
            return int(self.execute("job_message_forget", values).rowcount)
        if isinstance(change, LedgerPartitions):
            return self._ledger_partitions(change)
        if isinstance(change, LedgerDrop):
            return self._ledger_drop(change)
        if isinstance(change, DerivedPurge):
            return self._derived_purge(change)
        if isinstance(change, BlobPurge):
            if not change.hashes:
                return 0
            keys = [(bytes.fromhex(digest),) for digest in change.hashes]
            found = self.rows_executed("blob_purge", ("hashes",), keys, {"before": change.before})
            return sum(int(cursor.rowcount) for cursor in found)
        if isinstance(change, GcCursorPut):
            self.execute("gc_cursor_put", query_params(change))
            return 0
        self.fetchall("gc_vacuum")
        return 0

    # -- ledger partitions: none here (SQLite); the PostgreSQL backend overrides these ----

    def _ledger_partitions(self, change: LedgerPartitions) -> int:
        return 0

    def _ledger_drop(self, change: LedgerDrop) -> LedgerDropped:
        return LedgerDropped()

    def _ledger_move(
        self, moved: Sequence[tuple[Mapping[str, Any], list[TraceEvent], float]]
    ) -> None:
        """Write each (pack row, kept events, expiry) into the ledger partition of its day."""
        raise NotImplementedError("no ledger partitions on this backend")

    def _unmove(self, job_id: int) -> None:
        """Move a pinned job's packs out of its ledger partition, back into ``rq_trace``."""

    # -- trimming and deleting finished jobs, a batch at a time ----------------------------

    def _lockable(self, job_ids: Sequence[int], now: float) -> list[int]:
        """Lock the finished jobs gc is about to change: those still finished, neither pinned
        nor held by a live fork or dry-run (gc leaves the others alone)."""
        if not job_ids:
            return []
        locked = [
            int(r["id"])
            for r in self.fetchall("gc_jobs_lock", {"job_ids": self.list_param(list(job_ids))})
        ]
        if not locked:
            return []
        values = {"job_ids": self.list_param(locked), "now": now}
        spared = {int(r["job_id"]) for r in self.fetchall("gc_jobs_held", values)}
        return [job_id for job_id in locked if job_id not in spared]

    def _id_list(self, job_ids: Sequence[int]) -> dict[str, Any]:
        """A batch of job ids as a list parameter, with its lowest and highest."""
        ids = list(job_ids)
        return {"job_ids": self.list_param(ids), "low": min(ids), "high": max(ids)}

    def _full_packs(self, job_ids: Sequence[int]) -> dict[int, list[Mapping[str, Any]]]:
        """The full-tier packs (``rq_trace``) of these jobs, by job, in id order."""
        by_job: dict[int, list[Mapping[str, Any]]] = {}
        rows = self.fetchall("gc_trace_for_jobs", self._id_list(job_ids))
        for row in sorted(rows, key=lambda r: int(r["id"])):
            by_job.setdefault(int(row["job_id"]), []).append(row)
        return by_job

    def _trim(self, change: TraceTrim) -> int:
        jobs = self._lockable(change.job_ids, change.now)
        if not jobs:
            return 0
        removed = 0
        gone: list[tuple[int, Sequence[TraceEvent]]] = []  # packs whose index entries go
        deleted: list[int] = []
        rewritten: list[dict[str, Any]] = []
        entries: list[dict[str, Any]] = []
        moved: list[tuple[Mapping[str, Any], list[TraceEvent], float]] = []
        for job_id, rows in self._full_packs(jobs).items():
            unpacked = [(row, packs.unpack(row, self.pack_dictionaries)) for row in rows]
            everything = sorted(
                (e for _, events in unpacked for e in events), key=lambda e: (e.hlc, e.id or 0)
            )
            kept = {e.id: e for e in change.keep(everything)}
            removed += len(everything) - len(kept)
            expires_at = change.expires_at.get(job_id) if self.ledger_partitioned else None
            for row, events in unpacked:
                now_events = [kept[e.id] for e in events if e.id in kept]
                pack_id = int(row["id"])
                if expires_at is not None:
                    # Into the ledger partition of its expiry day, changed or not.
                    gone.append((pack_id, events))
                    deleted.append(pack_id)
                    if now_events:
                        moved.append((row, now_events, expires_at))
                    continue
                if now_events == events:
                    continue
                gone.append((pack_id, events))
                if not now_events:
                    deleted.append(pack_id)
                    continue
                rewritten.append({**self.pack_row(now_events), "id": pack_id})
                entries.extend(packs.pack_resources(now_events, pack_id))
        self._resources_delete(gone)
        if deleted:
            self.execute("trace_packs_delete", {"ids": self.list_param(deleted)})
        if rewritten:
            self.executemany("trace_pack_rewrite", rewritten)
        if entries:
            self.executemany("trace_resources_append", entries)
        if moved:
            self._ledger_move(moved)
        return removed

    def _purge(self, change: JobPurge) -> int:
        jobs = self._lockable(change.job_ids, change.now)
        if not jobs:
            return 0
        values = self._id_list(jobs)
        self.execute("jobs_hours_add", values)
        found = self._full_packs(jobs)
        self._resources_delete(
            [
                (int(row["id"]), packs.unpack(row, self.pack_dictionaries))
                for rows in found.values()
                for row in rows
            ]
        )
        if found:
            self.execute("jobs_trace_delete", values)
        self.execute("jobs_steps_delete", values)
        self.execute("jobs_delete", values)
        return len(jobs)

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
        rows = self.fetchall("gc_trace_derived", {"trace_id": change.trace_id})
        self._resources_delete(
            [(row["id"], packs.unpack(row, self.pack_dictionaries)) for row in rows]
        )
        self.execute("derived_trace_delete", {"trace_id": change.trace_id})
        branch = row["branch"]
        if branch:
            for query in ("branch_versions_delete", "branch_entities_delete", "branch_delete"):
                self.execute(query, {"branch": branch})
        self.execute("lineage_delete", {"trace_id": change.trace_id})
        return 1
