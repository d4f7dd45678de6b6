"""The protocol's verbs implemented once over named queries; backends supply SQL and a driver.

Both SQLite (``sqlite3``) and PostgreSQL (``psycopg``) connections accept a
mapping of named parameters and return rows addressable by column name, so
one implementation serves both; what differs lives in each ``queries.sql``.

Here: the plumbing and the queue and rollout verbs. The verbs of the other nouns are
mixins over that plumbing: ``trace_verbs`` (the trace's packs), ``context_verbs``,
``report_verbs`` and ``retention_verbs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from replayq import codec
from replayq.errors import StorageError
from replayq.model import Job, JobState, TraceEvent
from replayq.storage import packs
from replayq.storage.context_verbs import ContextVerbs, lease_now, query_params, record
from replayq.storage.lifecycle_packs import enqueued_event
from replayq.storage.pack_dictionaries import PackDictionaries
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
    LeaseRelease,
    LeasesExpired,
    LeasesExtend,
    RolloutChange,
    RolloutQuery,
    RoutingHistory,
    RoutingPut,
    RoutingQuery,
)
from replayq.storage.protocol import UNPIPELINED
from replayq.storage.records import (
    Comparison,
    ContractRecord,
    RoutingEvent,
    RoutingRecord,
)
from replayq.storage.report_verbs import ReportVerbs, by_state
from replayq.storage.retention_verbs import RetentionVerbs
from replayq.storage.trace_verbs import OpenPack, TraceVerbs

# The row columns of ``jobs_complete`` (``rows_param``), in ``JobsComplete.jobs`` order.
JOBS_COMPLETE_COLUMNS = ("job_ids", "owner_tokens", "results", "hlcs")

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


# Every column of a job row (``SELECT *``, ``RETURNING *``): the ``Job`` fields, no more.
_JOB_ROW = frozenset((*_JOB_COLUMNS, "payload", "result"))
# SQLite's job row since migration 0023: those and its ``job.enqueued`` pack's two columns
# (``enqueued_hlc``, ``enqueued``), which no ``Job`` field holds.
_ENQUEUED_COLUMNS = ("enqueued_hlc", "enqueued")
_JOB_ROW_PACKED = _JOB_ROW.union(_ENQUEUED_COLUMNS)
# A state's member by its stored text, without the ``Enum`` call's machinery.
_STATES = {state.value: state for state in JobState}
# How often a job insert that met a duplicate message id whose job was deleted before it
# could be read tries again (``existing_or_inserted``): once is what a gc needs.
INSERT_TRIES = 3


def row_to_job(row: Mapping[str, Any]) -> Job:
    fields = {name: row[name] for name in _JOB_COLUMNS}
    fields["state"] = _STATES[fields["state"]]
    fields["payload"] = codec.loads(row["payload"])
    fields["result"] = codec.loads(row["result"])
    return Job.built(fields)


class SqlTransaction(TraceVerbs, ReportVerbs, RetentionVerbs, ContextVerbs):
    """Implements ``storage.protocol.Transaction`` on one open DB-API connection."""

    # How this backend stores a pack's events (storage/packs.py): SQLite deflates them
    # with the format's dictionary; PostgreSQL keeps JSON text (``PostgresTransaction``).
    pack_format = packs.FORMAT_DEFLATE
    # The learned dictionaries of format 5 packs (storage/pack_dictionaries.py): set by the
    # SQLite storage on each of its transactions; none on PostgreSQL (JSON packs).
    pack_dictionaries: PackDictionaries | None = None

    def __init__(
        self,
        connection: Any,
        queries: Mapping[str, str],
        *,
        last_pack: OpenPack | None = None,
    ) -> None:
        self.connection = connection
        # What runs the statements (``execute``): the connection, or one cursor of it for
        # the whole transaction (``PostgresTransaction.pooled``).
        self.statements: Any = connection
        self._queries = queries
        # The trace pack written last on this connection and its events (trace_append):
        # this transaction's, or the one a committed transaction before it wrote last
        # (``last_pack``, carried by the SQLite backend), which later events of the same
        # attempt join instead of starting a row of their own.
        self._last_pack = last_pack
        # The writer of the format 2 row ``pack_row`` built last (``_placed`` keeps it).
        self._writer: packs.Writer | None = None
        # Whether this transaction may have made a job ready (an insert, a transition, an
        # ack of a job with an ordering key): only such a commit wakes the process's idle
        # workers at once (SQLite ``Watcher.poke``). A commit of a step's events and state
        # writes does not, nor a lease, nor the acks of jobs without an ordering key.
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

    def rows_query(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> tuple[str, dict[str, Any]]:
        """``name``'s SQL and its parameters: ``params`` and ``rows`` (``rows_param``; SQLite
        binds each row's values in the statement instead: ``SqliteTransaction``)."""
        return self._queries[name], {**params, **self.rows_param(columns, rows)}

    def rows_executed(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        params: Mapping[str, Any],
    ) -> list[Any]:
        """``name`` run over ``rows`` with ``params`` (``rows_query``): its cursors, one
        here (SQLite: one per chunk of its limit on a statement's parameters)."""
        return [self.statements.execute(*self.rows_query(name, columns, rows, params))]

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.statements.execute(self._queries[name], params or {})

    def execute_nullable(self, name: str, params: Mapping[str, Any]) -> Any:
        """``execute`` for a statement whose parameters are often ``None`` (SQLite writes
        those ``NULL`` in its text: ``SqliteTransaction.execute_nullable``)."""
        return self.execute(name, params)

    def send(self, name: str, params: Mapping[str, Any], *, nullable: bool = False) -> None:
        if nullable:
            self.execute_nullable(name, params)
        else:
            self.execute(name, params)

    def send_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.executemany(name, rows)

    def pack_row(self, events: Sequence[TraceEvent]) -> dict[str, Any]:
        """``packs.pack_row`` in this backend's format; its format 2 writer kept until
        the next row (the pack, once inserted, may be joined by later commits)."""
        row, self._writer = packs.opened_row(events, self.pack_format, self.pack_dictionaries)
        return row

    def execute_rows(self, name: str, row_sql: str, rows: int, values: Sequence[Any]) -> Any:
        """``name``'s statement with its ``(:rows)`` as ``rows`` copies of ``row_sql``
        (a multi-row ``VALUES``), given ``values`` positionally."""
        sql = self._queries[name].replace("(:rows)", ", ".join([row_sql] * rows))
        return self.connection.execute(sql, values)

    def executemany(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        cursor = self.connection.cursor()
        cursor.executemany(self._queries[name], rows)

    def columns(self, cursor: Any) -> list[str]:
        """The column names of ``cursor``'s result (DB-API ``description``)."""
        return [d[0] for d in cursor.description]

    def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        cursor = self.execute(name, params)
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip(self.columns(cursor), row, strict=True))

    def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        cursor = self.execute(name, params)
        rows = cursor.fetchall()
        if not rows:
            return []
        columns = self.columns(cursor)
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def fetch_jobs(self, name: str, params: Mapping[str, Any]) -> list[Job]:
        """The jobs of ``name``'s rows (every column of ``rq_jobs``): each row's values
        become the job's fields directly, one dictionary per job (``fetchall`` and
        ``row_to_job`` made two)."""
        return self.jobs_of(self.execute(name, params))

    def jobs_of(self, cursor: Any) -> list[Job]:
        """The jobs of ``cursor``'s rows (``fetch_jobs``)."""
        rows = cursor.fetchall()
        if not rows:
            return []
        columns = self.columns(cursor)
        packed = len(columns) == len(_JOB_ROW_PACKED) and _JOB_ROW_PACKED.issuperset(columns)
        if not packed and (len(columns) != len(_JOB_ROW) or not _JOB_ROW.issuperset(columns)):
            return [row_to_job(dict(zip(columns, row, strict=True))) for row in rows]
        jobs = []
        loads, states, built = codec.loads, _STATES, Job.built
        for row in rows:
            fields = dict(zip(columns, row, strict=True))
            if packed:  # SQLite's row holds its job.enqueued pack: no field of the job
                del fields["enqueued_hlc"], fields["enqueued"]
            fields["state"] = states[fields["state"]]
            fields["payload"] = loads(fields["payload"])
            result = fields["result"]
            if result is not None:  # a leased job has none yet
                fields["result"] = loads(result)
            jobs.append(built(fields))
        return jobs

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        return bool(self.execute(name, params).rowcount)

    def inserted_id(self, name: str, params: Mapping[str, Any]) -> int | None:
        """The id of the one row ``name`` inserts; ``None`` if it inserted none (``ON
        CONFLICT DO NOTHING``). Its SQL ends ``RETURNING id`` (SQLite reads the cursor's
        ``lastrowid`` instead: ``SqliteTransaction.inserted_id``)."""
        row = self.execute(name, params).fetchone()
        return None if row is None else int(row[0])

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        ((job_id, created),) = self.job_enqueue([params])
        return job_id, created

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        """Insert jobs and, for each row inserted, its ``job.enqueued`` event
        (``lifecycle_packs.enqueued_event``, its ``job_id`` the new row's id) as that job's
        first pack.

        Here every job insert is its own statement (on SQLite an in-process call, no
        round trip) and all the packs go in one multi-row insert (``_packs_inserted``).
        """
        if len(params) == 1:  # ``enqueue``: no lists to zip
            job_id, created = self._job_insert_one(params[0])
            if created:
                pack = [with_job_id(enqueued_event(params[0]), job_id)]
                self._index(self._packs_inserted([pack]))
            return [(job_id, created)]
        inserted = [self._job_insert_one(p) for p in params]
        written = [
            [with_job_id(enqueued_event(p), job_id)]
            for p, (job_id, created) in zip(params, inserted, strict=True)
            if created
        ]
        if written:
            self._index(self._packs_inserted(written))
        return inserted

    def _job_insert_one(self, params: JobInsert) -> tuple[int, bool]:
        """The new job's id and ``True``, or the id of the job that already has its
        message id and ``False`` (``existing_or_inserted``)."""
        self.jobs_changed = True
        values = query_params(params)
        job_id = self.inserted_id("job_insert", values)
        if job_id is not None:
            return job_id, True
        return self.existing_or_inserted(params, lambda: self.inserted_id("job_insert", values))

    def existing_or_inserted(
        self, params: JobInsert, insert: Callable[[], int | None]
    ) -> tuple[int, bool]:
        """After ``insert()`` met a duplicate message id: the id of the job that has it and
        ``False``, or, if that job is gone, ``insert()``'s new job id and ``True``.

        Outside a transaction (``Autocommit``) the insert and the read of the job it met
        are two statements, each committed by itself: that job can be deleted in between
        (gc of a finished job). Its message id is free then, and the insert is tried again.
        """
        for _ in range(INSERT_TRIES):
            existing = self.fetchone(
                "job_by_message_id", {"job_type": params.job_type, "message_id": params.message_id}
            )
            if existing is not None:
                return int(existing["id"]), False
            job_id = insert()
            if job_id is not None:
                return job_id, True
        raise StorageError(
            f"job {params.job_type!r} with message id {params.message_id!r}: the job that had "
            f"it was deleted between the insert and its read, {INSERT_TRIES} times"
        )

    def job_get(self, job_id: int) -> Job | None:
        # ``jobs_of``: the row's values become the job's fields, one dictionary (``fetchone``
        # and ``row_to_job`` made two, the second by name from the first).
        found = self.jobs_of(self.execute("job_get", {"job_id": job_id}))
        return found[0] if found else None

    def job_lease(self, params: JobLease) -> list[Job]:
        """The candidates, then one ``UPDATE`` that claims them all (``job_lease_many``);
        SQLite's write transaction is ``BEGIN IMMEDIATE``: nobody claims in between."""
        candidates = self.execute(
            "job_lease_candidates",
            {
                "now": params.now,
                "queues": self.list_param(params.queues),
                "job_types": self.list_param(params.job_types),
                "skip_ids": self.list_param(params.skip_ids),
                "limit": params.limit,
            },
        ).fetchall()  # (id, job_type) rows
        if not candidates:
            return []
        lease_for, version_for = params.lease_for, params.version_for
        default = params.default_lease_seconds
        claims = [
            (job_id, float(lease_for.get(job_type, default)), version_for.get(job_type))
            for job_id, job_type in candidates
        ]
        cursors = self.rows_executed(
            "job_lease_many",
            ("job_ids", "lease_seconds", "versions"),
            claims,
            {
                "owner_token": params.owner_token,
                "worker_id": params.worker_id,
                "lease_now": lease_now(params.now, params.database_clock),
                "hlc": params.hlc,
            },
        )
        leased = [job for cursor in cursors for job in self.jobs_of(cursor)]
        # RETURNING gives no order: the jobs go out in the order they were chosen.
        chosen = {job_id: i for i, (job_id, _) in enumerate(candidates)}
        leased.sort(key=lambda job: chosen[job.id])
        return leased

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
        # The time is a scalar: SQLite's JSON read a float back a bit off.
        cursors = self.rows_executed(
            "jobs_complete", JOBS_COMPLETE_COLUMNS, params.jobs, {"now": params.now}
        )
        return self.completed([row for cursor in cursors for row in cursor.fetchall()])

    def jobs_complete_sent(self, params: JobsComplete) -> Callable[[], set[int]]:
        """``jobs_complete`` whose answer is read by the function returned: here at once
        (PostgreSQL, in a ``pipelined`` block: with the next statement that waits)."""
        held = self.jobs_complete(params)
        return lambda: held

    def pipelined(self, *, refusals: bool = False) -> AbstractContextManager[None]:
        """The end of this transaction (``protocol.Transaction.pipelined``): here every
        statement waits for its result as anywhere, and the transaction commits as it
        would have, when the caller's ``transaction()`` block ends right after. One
        shared ``nullcontext``: a SQLite step's commit asks for it (a generator-based
        context manager was ~5,000 instructions each, six a traced job)."""
        return UNPIPELINED

    def completed(self, acked: Sequence[Sequence[Any]]) -> set[int]:
        """The ids ``jobs_complete``'s ``(id, ordering_key)`` rows name."""
        # An ack makes another job ready only behind its ordering key: only then does its
        # commit wake this process's idle workers at once (a worker's every group commit
        # did, a thread wake-up and a query for each batch of a busy drain).
        if any(ordering_key is not None for _, ordering_key in acked):
            self.jobs_changed = True
        return {int(job_id) for job_id, _ in acked}

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
