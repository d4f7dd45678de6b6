"""The protocol's verbs implemented once over named queries; backends supply SQL and a driver.

Both SQLite (``sqlite3``) and PostgreSQL (``psycopg``) connections accept a
mapping of named parameters and return rows addressable by column name, so
one implementation serves both; what differs lives in each ``queries.sql``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from replayq import codec
from replayq.errors import ConfigurationError
from replayq.model import Job, JobState, TraceEvent
from replayq.storage import packs
from replayq.storage.context_params import TraceFence
from replayq.storage.context_verbs import ContextVerbs, lease_now, query_params, record
from replayq.storage.params import (
    ActiveVersion,
    CancelRequested,
    ContractActivate,
    ContractPut,
    ContractQuery,
    JobBury,
    JobCancel,
    JobCancelRequest,
    JobCancelRunning,
    JobChange,
    JobInsert,
    JobLease,
    JobMatch,
    JobQuery,
    JobRedeliver,
    JobReleaseRunning,
    JobRequeue,
    JobReroute,
    JobRetry,
    JobRoute,
    JobsComplete,
    JobSetRecorded,
    JobTrace,
    LeaseRelease,
    LeasesExpired,
    LeasesExtend,
    RolloutChange,
    RolloutQuery,
    RoutingHistory,
    RoutingPut,
    RoutingQuery,
    TraceJobs,
    TraceRead,
    TraceWindow,
)
from replayq.storage.records import (
    Comparison,
    ContractRecord,
    RoutingEvent,
    RoutingRecord,
)
from replayq.storage.report_verbs import ReportVerbs, by_state
from replayq.storage.retention_verbs import RetentionVerbs

# Above every job id (BIGINT's largest): the bound of a job list's first page.
LAST_ID = 2**63 - 1

_JOB_COLUMNS = (
    "id",
    "job_type",
    "queue",
    "state",
    "priority",
    "run_at",
    "created_at",
    "attempt",
    "max_attempts",
    "trace_id",
    "message_id",
    "ordering_key",
    "idempotency_key",
    "handler_version",
    "owner_token",
    "worker_id",
    "leased_at",
    "lease_deadline",
    "redelivery_count",
    "last_error_class",
    "last_error",
    "dead_reason",
    "finished_at",
    "hlc",
    "correlation_id",
    "causation_id",
    "origin",
    "trace_context",
    "cancel_requested_at",
)

_EVENT_COLUMNS = (
    "id",
    "trace_id",
    "job_id",
    "attempt",
    "kind",
    "name",
    "seq",
    "step",
    "ts",
    "hlc",
    "worker_id",
    "status",
    "resource",
    "resource_version",
    "input_ref",
    "output_ref",
)


# A pack later events of its attempt may join: its id, its events and, in format 2, the
# writer of its deflate stream (``packs.PackWriter``).
OpenPack = tuple[int, list[TraceEvent], "packs.PackWriter | None"]

# The columns of an ``rq_trace`` row (``packs.pack_row``) as ``trace_append_rows`` takes them.
PACK_COLUMNS = ("trace_id", "job_id", "attempt", "worker_id", "hlc", "hlc_last", "ts", "events")
# Bound parameters per statement where the driver cannot say (SQLite's historical default).
_DEFAULT_VARIABLE_LIMIT = 999

# The named query of each compare-and-set on a job row (``JobBury`` picks one of two).
_JOB_QUERIES: dict[type[Any], str] = {
    JobRetry: "job_retry",
    JobCancel: "job_cancel",
    JobCancelRequest: "job_cancel_request",
    JobCancelRunning: "job_cancel_running",
    JobReleaseRunning: "job_release_running",
    JobRequeue: "job_requeue",
    LeaseRelease: "lease_release",
    JobRedeliver: "job_redeliver",
    JobRoute: "job_route",
    JobSetRecorded: "job_set_recorded",
}


def with_job_id(event: TraceEvent, job_id: int) -> TraceEvent:
    """``event`` of the job whose id the insert just gave."""
    return TraceEvent.built({**event.__dict__, "job_id": job_id})


def row_to_job(row: Mapping[str, Any]) -> Job:
    fields = {name: row[name] for name in _JOB_COLUMNS}
    fields["state"] = JobState(fields["state"])
    return Job(payload=codec.loads(row["payload"]), result=codec.loads(row["result"]), **fields)


def row_to_event(row: Mapping[str, Any]) -> TraceEvent:
    fields = {name: row[name] for name in _EVENT_COLUMNS}
    fields["side_effect"] = bool(row["side_effect"])
    fields["data"] = codec.loads(row["data"])
    return TraceEvent.of(fields)


class SqlTransaction(ReportVerbs, RetentionVerbs, ContextVerbs):
    """Implements ``storage.protocol.Transaction`` on one open DB-API connection."""

    # How this backend stores a pack's events (storage/packs.py): SQLite deflates them
    # with the format's dictionary; PostgreSQL keeps JSON text (``PostgresTransaction``).
    pack_format = packs.FORMAT_DEFLATE

    # How an insert's new id comes back (``inserted_id``): as its row (``RETURNING id``,
    # PostgreSQL) or as the cursor's ``lastrowid`` (SQLite, whose RETURNING builds a
    # temporary table each time it runs: ~15 µs of an insert in its own transaction).
    ids_returned = True

    def __init__(
        self,
        connection: Any,
        queries: Mapping[str, str],
        *,
        last_pack: OpenPack | None = None,
    ) -> None:
        self.connection = connection
        self._queries = queries
        # The trace pack written last on this connection and its events (trace_append):
        # this transaction's, or the one a committed transaction before it wrote last
        # (``last_pack``, carried by the SQLite backend), which later events of the same
        # attempt join instead of starting a row of their own.
        self._last_pack = last_pack
        # The writer of the format 2 row ``pack_row`` built last (``_placed`` keeps it).
        self._writer: packs.PackWriter | None = None
        # Whether this transaction changed a job row (insert or transition): only such a
        # commit can make a job ready, so only it wakes the process's idle workers at once
        # (SQLite ``Watcher.poke``). A commit of a step's events and state writes does not.
        self.jobs_changed = False

    @property
    def last_pack(self) -> OpenPack | None:
        """The pack later events of its attempt may join, once this transaction commits."""
        return self._last_pack

    # -- plumbing ---------------------------------------------------------------------------

    def list_param(self, values: Sequence[str] | Sequence[int] | None) -> Any:
        """How a list parameter is passed (SQLite: JSON text for ``json_each``)."""
        return None if values is None else codec.dumps(list(values))

    def rows_param(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """How a statement's many rows are passed (SQLite: one JSON array ``:rows`` of
        rows, read with ``json_each``; PostgreSQL: an array per column, for ``unnest``)."""
        return {"rows": codec.dumps([list(row) for row in rows])}

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.connection.execute(self._queries[name], params or {})

    def pack_row(self, events: Sequence[TraceEvent]) -> dict[str, Any]:
        """``packs.pack_row`` in this backend's format; its format 2 writer kept until
        the next row (the pack, once inserted, may be joined by later commits)."""
        row, self._writer = packs.opened_row(events, self.pack_format)
        return row

    def execute_rows(self, name: str, row_sql: str, rows: int, values: Sequence[Any]) -> Any:
        """``name``'s statement with its ``(:rows)`` as ``rows`` copies of ``row_sql``
        (a multi-row ``VALUES``), given ``values`` positionally."""
        sql = self._queries[name].replace("(:rows)", ", ".join([row_sql] * rows))
        return self.connection.execute(sql, values)

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        cursor = self.connection.cursor()
        cursor.executemany(self._queries[name], rows)

    def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        cursor = self.execute(name, params)
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cursor.description], row, strict=True))

    def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        cursor = self.execute(name, params)
        rows = cursor.fetchall()
        if not rows:
            return []
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        return bool(self.execute(name, params).rowcount)

    def inserted_id(self, name: str, params: Mapping[str, Any]) -> int | None:
        """The id of the one row ``name`` inserts; ``None`` if it inserted none (``ON
        CONFLICT DO NOTHING``). Its SQL ends ``RETURNING id`` where ``ids_returned``."""
        cursor = self.execute(name, params)
        if self.ids_returned:
            row = cursor.fetchone()
            return None if row is None else int(row[0])
        return int(cursor.lastrowid) if cursor.rowcount > 0 else None

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        return self._job_insert_one(params)

    def job_enqueue(
        self, params: Sequence[JobInsert], events: Sequence[TraceEvent]
    ) -> list[tuple[int, bool]]:
        """Insert jobs and, for each row inserted, its event (``events[i]`` for
        ``params[i]``, its ``job_id`` set to the new row's id) as that job's first pack.

        Here every job insert is its own statement (on SQLite an in-process call, no
        round trip) and all the packs go in one multi-row insert (``_packs_inserted``).
        """
        inserted = [self._job_insert_one(p) for p in params]
        written = [
            [with_job_id(event, job_id)]
            for event, (job_id, created) in zip(events, inserted, strict=True)
            if created
        ]
        if written:
            self._index(self._packs_inserted(written))
        return inserted

    def _packs_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[dict[str, Any]]:
        """A new pack for each group (``packs.groups``), in as few statements as the
        driver's limit on parameters allows (one for any batch of up to ~4,000) where the
        backend has a many-row insert; their ``rq_trace_resources`` entries. The last
        pack is the one later events of its group may join (``_last_pack``)."""
        if len(groups) > 1:
            return self._packs_placed(groups, self._pack_rows_inserted(groups))
        # One pack (``enqueue``, a step's commit): the fixed one-row statement.
        pack_id = self.inserted_id("trace_append", self.pack_row(groups[0]))
        assert pack_id is not None
        return self._packs_placed(groups, [pack_id])

    def _packs_placed(
        self, groups: Sequence[Sequence[TraceEvent]], pack_ids: Sequence[int]
    ) -> list[dict[str, Any]]:
        """After new packs of ``groups`` (``pack_ids[i]`` for ``groups[i]``, each made by
        ``pack_row`` in turn): their ``rq_trace_resources`` entries; the last is
        remembered as the pack later events of its group may join (``_last_pack``)."""
        entries = []
        for group, pack_id in zip(groups, pack_ids, strict=True):
            entries.extend(packs.pack_resources(group, pack_id))
        # pack_row keeps the writer of the row it made last: the last group's.
        self._last_pack = (pack_ids[-1], list(groups[-1]), self._writer)
        return entries

    def _placed(self, events: Sequence[TraceEvent], pack_ids: Mapping[int, int]) -> None:
        """After new packs of ``events`` (one each, by job id, the last made last): their
        resources indexed (``_packs_placed``)."""
        ids = []
        for event in events:
            assert event.job_id is not None
            ids.append(pack_ids[event.job_id])
        self._index(self._packs_placed([[e] for e in events], ids))

    def _index(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """``rq_trace_resources`` entries, in one ``executemany``."""
        if entries:
            self.executemany("trace_resources_append", entries)

    def _pack_rows_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[int]:
        """``trace_append_rows`` for ``groups``: their pack ids, in order (SQLite: a
        multi-row ``VALUES`` per chunk of the driver's parameter limit)."""
        columns = PACK_COLUMNS
        limit = getattr(self.connection, "getlimit", None)
        most = (
            limit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            if limit is not None
            else _DEFAULT_VARIABLE_LIMIT
        )
        per_statement = max(1, most // len(columns))
        row_sql = "(" + ", ".join("?" * len(columns)) + ")"
        pack_ids: list[int] = []
        for start in range(0, len(groups), per_statement):
            chunk = groups[start : start + per_statement]
            values: list[Any] = []
            for group in chunk:
                row = self.pack_row(group)
                values.extend(row[name] for name in columns)
            found = self.execute_rows("trace_append_rows", row_sql, len(chunk), values)
            # RETURNING has no order; the rows' ids rise in the order they were inserted
            # (a new rowid is the largest one plus one).
            pack_ids.extend(sorted(int(row[0]) for row in found.fetchall()))
        return pack_ids

    def _job_insert_one(self, params: JobInsert) -> tuple[int, bool]:
        self.jobs_changed = True
        job_id = self.inserted_id("job_insert", query_params(params))
        if job_id is not None:
            return job_id, True
        existing = self.fetchone(
            "job_by_message_id", {"job_type": params.job_type, "message_id": params.message_id}
        )
        return int(existing["id"]), False

    def job_get(self, job_id: int) -> Job | None:
        row = self.fetchone("job_get", {"job_id": job_id})
        return row_to_job(row) if row is not None else None

    def job_lease(self, params: JobLease) -> list[Job]:
        """The candidates, then one ``UPDATE`` that claims them all (``job_lease_many``);
        SQLite's write transaction is ``BEGIN IMMEDIATE``: nobody claims in between."""
        candidates = self.fetchall(
            "job_lease_candidates",
            {
                "now": params.now,
                "queues": self.list_param(params.queues),
                "job_types": self.list_param(params.job_types),
                "limit": params.limit,
            },
        )
        if not candidates:
            return []
        claims = [
            (
                c["id"],
                float(params.lease_for.get(c["job_type"], params.default_lease_seconds)),
                params.version_for.get(c["job_type"]),
            )
            for c in candidates
        ]
        values = {
            "owner_token": params.owner_token,
            "worker_id": params.worker_id,
            "lease_now": lease_now(params.now, params.database_clock),
            "hlc": params.hlc,
            **self.rows_param(("job_ids", "lease_seconds", "versions"), claims),
        }
        rows = self.fetchall("job_lease_many", values)
        # RETURNING gives no order: the jobs go out in the order they were chosen.
        chosen = {c["id"]: i for i, c in enumerate(candidates)}
        return sorted((row_to_job(row) for row in rows), key=lambda job: chosen[job.id])

    def lease_check(self, job_id: int, owner_token: str) -> bool:
        row = self.fetchone("lease_check", {"job_id": job_id, "owner_token": owner_token})
        return row is not None

    def lease_extend(self, params: LeasesExtend) -> set[int]:
        if not params.leases:
            return set()
        leases = [(job_id, token, float(seconds)) for job_id, token, seconds in params.leases]
        values = {
            "lease_now": lease_now(params.now, params.database_clock),
            **self.rows_param(("job_ids", "owner_tokens", "lease_seconds"), leases),
        }
        rows = self.fetchall("leases_extend", values)
        return {int(row["id"]) for row in rows}

    def jobs_complete(self, params: JobsComplete) -> set[int]:
        self.jobs_changed = True
        # The time is a scalar: SQLite's JSON reads a float back a bit off.
        rows = self.rows_param(("job_ids", "owner_tokens", "results", "hlcs"), params.jobs)
        return {
            int(row["id"]) for row in self.fetchall("jobs_complete", {"now": params.now, **rows})
        }

    def job_transition(self, change: JobChange | JobReroute) -> Any:
        self.jobs_changed = True
        if isinstance(change, JobReroute):
            return int(self.execute("job_reroute", query_params(change)).rowcount)
        if isinstance(change, JobBury):
            query = "job_bury_queued" if change.owner_token is None else "job_bury_owned"
        elif isinstance(change, LeaseRelease) and not change.started:
            query = "lease_return"
        else:
            query = _JOB_QUERIES[type(change)]
        return self.changed(query, query_params(change))

    def job_match(self, params: JobMatch) -> list[int]:
        values = {**query_params(params), "states": self.list_param(params.states)}
        return [int(row["id"]) for row in self.fetchall("job_match", values)]

    def job_list(self, params: JobQuery) -> list[Job]:
        if isinstance(params, CancelRequested):
            rows = self.fetchall("job_cancel_requested", {"worker_id": params.worker_id})
            return [row_to_job(r) for r in rows]
        if isinstance(params, LeasesExpired):
            values = {"lease_now": lease_now(params.now, params.database_clock)}
            rows = self.fetchall("lease_reap", {**values, "limit": params.limit})
            return [row_to_job(r) for r in rows]
        rows = self.fetchall(
            by_state("job_list", params.states),
            {
                "states": self.list_param(params.states),
                "job_type": params.job_type,
                "origin": params.origin,
                "version": params.version,
                # No page yet: below every id (a plain bound lets the scan seek to it).
                "before": params.before if params.before is not None else LAST_ID,
                "limit": params.limit,
            },
        )
        return [row_to_job(r) for r in rows]

    # -- trace ------------------------------------------------------------------------------

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """One ``rq_trace`` row per job attempt (or derived trace) among ``events``, with
        an ``rq_trace_resources`` entry per resource its events name (storage/packs.py);
        all of those entries in one ``executemany``.

        Events that continue the pack this transaction wrote last (same trace, job,
        attempt and worker: a context's pending events, then the ack's) join that pack,
        as do those continuing the pack the connection's last committed transaction
        wrote (``last_pack``: SQLite). With ``fence`` the first new pack's insert or
        deflated pack's append is also the lease check (``trace_append_fenced``,
        ``trace_join_fenced``); the check is asked on its own before a JSON pack is
        rewritten, and after an append that changed nothing (the lease, or the pack?);
        ``False``, nothing written, once the lease is gone.

        The packs after the first new one go in together (``_packs_inserted``: one
        statement on SQLite for a lease batch's or a group commit's packs).
        """
        entries = []
        cut = list(packs.groups(events))
        for at, group in enumerate(cut):
            last = self._last_pack
            joins = last is not None and packs.same_pack(last[1], group)
            if fence is not None and joins and (last is None or last[2] is None):
                # Joining a JSON pack rewrites it (trace_extend, no fenced form): the lease
                # is asked first, so that nothing is written once it is gone.
                if not self.lease_check(fence.job_id, fence.owner_token):
                    return False
                fence = None
            extended = self._pack_extended(group, fence if joins else None)
            if fence is not None and joins:
                # The append was the lease check (trace_join_fenced); nothing appended is
                # either a lost lease or a pack rewritten since: only then is it asked.
                if extended is None and not self.lease_check(fence.job_id, fence.owner_token):
                    return False
                fence = None
            if extended is not None:
                pack_id, joined, new = extended
                assert last is not None
                self._last_pack = (pack_id, joined, last[2])
            elif fence is not None:
                placed = self._pack_inserted_fenced(group, fence)
                if placed is None:
                    return False
                fence = None
                pack_id, joined, new, writer = placed
                self._last_pack = (pack_id, joined, writer)
            else:
                # A new pack: no later group joins it or another (each differs from the
                # one before it, or that one is full), so they all go in with it.
                entries.extend(self._packs_inserted(cut[at:]))
                break
            entries.extend(packs.pack_resources(new, pack_id))
        if fence is not None and not self.lease_check(fence.job_id, fence.owner_token):
            return False  # nothing was inserted to check it with (no events, or all joined)
        self._index(entries)
        return True

    def _pack_extended(
        self, group: list[TraceEvent], fence: TraceFence | None = None
    ) -> tuple[int, list[TraceEvent], list[TraceEvent]] | None:
        """``group`` added to the pack this transaction wrote last, if it continues it:
        ``(pack id, all its events, the events naming a resource it did not name yet)``.

        In format 2 only ``group``'s items are compressed, appended to the stored bytes
        (``trace_join``; with ``fence``, ``trace_join_fenced``: only while the lease is
        held); a JSON pack (PostgreSQL, within one transaction) is rewritten.
        """
        last = self._last_pack
        if last is None or not packs.same_pack(last[1], group):
            return None
        pack_id, earlier, writer = last
        joined = [*earlier, *group]
        base = min(e.hlc for e in earlier)
        if writer is not None:
            if min(e.hlc for e in group) < base:
                return None  # the row's hlc is its items' base: a new pack instead
            row = {
                "id": pack_id,
                "trace_id": earlier[0].trace_id,
                "job_id": earlier[0].job_id,
                "attempt": earlier[0].attempt,
                "stored": writer.stored,
                "hlc_last": max(e.hlc for e in group),
            }
            # Appended through the deflate stream, never rewritten: no item texts kept.
            row["piece"] = writer.more(packs.pack_items(group, base, earlier[0].ts, keep=False))
            query = "trace_join"
            if fence is not None:
                query = "trace_join_fenced"
                row["fence_job_id"] = fence.job_id
                row["fence_owner_token"] = fence.owner_token
            # Not found if the pack was rolled back (to a savepoint) or rewritten since
            # (or, fenced, the lease is gone).
            if not self.changed(query, row):
                return None
        # Not found only if the pack was rolled back (to a savepoint): a new one then.
        elif not self.changed("trace_extend", {**self.pack_row(joined), "id": pack_id}):
            return None
        named = {e.resource for e in earlier}
        return pack_id, joined, [e for e in group if e.resource not in named]

    def _pack_inserted_fenced(
        self, group: list[TraceEvent], fence: TraceFence
    ) -> tuple[int, list[TraceEvent], list[TraceEvent], packs.PackWriter | None] | None:
        row = self.pack_row(group)
        row["fence_job_id"] = fence.job_id
        row["fence_owner_token"] = fence.owner_token
        found = self.fetchone("trace_append_fenced", row)
        return None if found is None else (found["id"], group, group, self._writer)

    def trace_query(self, query: TraceRead) -> Any:
        if isinstance(query, TraceJobs):
            return self._trace_jobs(query)
        if isinstance(query, TraceWindow):
            rows = self.fetchall("trace_window", query_params(query))
            return [(row_to_event(r), r["job_type"], r["version"]) for r in rows]
        if query.job_id is not None:
            return packs.unpack_sorted(self.fetchall("trace_for_job", {"job_id": query.job_id}))
        if query.trace_id is not None:
            rows = self.fetchall("trace_for_trace", {"trace_id": query.trace_id})
            return packs.unpack_sorted(rows)
        if query.resource is None:
            raise ConfigurationError("TraceQuery needs a job_id, a trace_id or a resource")
        resource = query.resource
        rows = self.fetchall("trace_for_resource", {"resource": resource})
        versioned = resource + ":v"
        return [
            e
            for e in packs.unpack_sorted(rows)
            if e.resource is not None
            and (e.resource == resource or e.resource.startswith(versioned))
        ]

    def _trace_jobs(self, params: TraceJobs) -> list[JobTrace]:
        rows = self.fetchall("trace_for_jobs", {"job_ids": self.list_param(params.job_ids)})
        by_job: dict[int, list[Any]] = {}
        for row in rows:
            by_job.setdefault(int(row["job_id"]), []).append(row)
        return [JobTrace(job_id, packs.unpack_sorted(found)) for job_id, found in by_job.items()]

    # -- contracts and rollouts -------------------------------------------------------------

    def rollout_query(self, query: RolloutQuery) -> Any:
        if isinstance(query, ContractQuery):
            rows = self.fetchall("contract_list", query_params(query))
            return [record(ContractRecord, r) for r in rows]
        if isinstance(query, ActiveVersion):
            row = self.fetchone("contract_active", {"job_type": query.job_type})
            return None if row is None else str(row["version"])
        if isinstance(query, RoutingQuery):
            rows = self.fetchall("routing_list", {"job_type": query.job_type})
            return [record(RoutingRecord, r) for r in rows]
        if isinstance(query, RoutingHistory):
            rows = self.fetchall("routing_events", {"job_type": query.job_type})
            return [record(RoutingEvent, r) for r in rows]
        rows = self.fetchall("comparison_list", query_params(query))
        return [record(Comparison, r) for r in rows]

    def rollout_update(self, change: RolloutChange) -> Any:
        if isinstance(change, RoutingPut):
            return self._routing_put(change)
        if isinstance(change, ContractPut):
            values = {
                "job_type": change.job_type,
                "version": change.version,
                "body": change.body_json,
                "now": change.now,
            }
            self.execute("contract_put", values)
        elif isinstance(change, ContractActivate):
            self.execute("contract_activate", query_params(change))
        else:
            self.execute("comparison_put", query_params(change))
        return None

    def _routing_put(self, params: RoutingPut) -> int | None:
        body = {"job_type": params.job_type, "body": params.body_json, "now": params.now}
        if params.expected_revision == 0:
            changed = self.changed("routing_insert", body)
        else:
            changed = self.changed(
                "routing_update", {**body, "expected_revision": params.expected_revision}
            )
        if not changed:
            return None
        revision = params.expected_revision + 1
        self.execute(
            "routing_event_append",
            {
                "job_type": params.job_type,
                "revision": revision,
                "action": params.action,
                "actor": params.actor,
                "reason": params.reason,
                "body": params.body_json,
                "now": params.now,
            },
        )
        return revision
