"""Verbs for what the recording context stores (state, locks, effects, cache, outbox, steps),
and the schedules of periodic jobs.

A mixin over ``SqlTransaction``'s plumbing (``execute``, ``fetchone``, ``fetchall``,
``changed``); the SQL lives in each backend's ``state.sql``, ``locks.sql``,
``effects.sql``, ``cache.sql``, ``outbox.sql``, ``steps.sql``, ``blobs.sql``,
``lineage.sql`` and ``schedules.sql``. Rows come back as the protocol's records
(``record(cls, row)``: one field per column, a missing column is an error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from msgspec import Struct, structs

from replayq.storage.context_params import (
    BlobPut,
    BranchCreate,
    CacheChange,
    CacheLookup,
    CachePut,
    EntityFilter,
    EntityGet,
    IdemChange,
    IdemClaim,
    IdemCompensate,
    IdemFail,
    IdemFilter,
    IdemResolve,
    IdemSucceed,
    IdemTakeover,
    LineagePut,
    LineageQuery,
    LockAcquire,
    LockChange,
    LockFilter,
    LockReleaseInTime,
    LockRenew,
    OutboxChange,
    OutboxClaim,
    OutboxInsert,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleMade,
    ScheduleRegister,
    StepComplete,
    lock_timeout_ms,
)
from replayq.storage.records import (
    Blob,
    Branch,
    CacheRecord,
    EntityRecord,
    IdemRecord,
    LineageRecord,
    Lock,
    LockGrant,
    OutboxRecord,
    ScheduleRecord,
    StepRecord,
)
from replayq.storage.sql_statements import SqlStatements

Row = dict[str, Any]
R = TypeVar("R", bound=Struct)


def record(cls: type[R], row: Mapping[str, Any]) -> R:
    """The record ``cls`` from a row, one field per column of the same name.

    A field with a default may be absent from the row (``IdemRecord.in_doubt``).
    """
    return cls(**{name: row[name] for name in cls.__struct_fields__ if name in row})


# A parameter struct as the named parameters of its query: msgspec's ``asdict`` itself
# (a Python function around it cost a call for each state write, claim and blob).
query_params: Callable[[Struct], dict[str, Any]] = structs.asdict


# Which named query each compare-and-set runs; ``True`` when it answers with a row.
_IDEM_QUERIES: dict[type[Any], tuple[str, bool]] = {
    IdemClaim: ("idem_claim", True),
    IdemTakeover: ("idem_takeover", False),
    IdemSucceed: ("idem_succeed", False),
    IdemFail: ("idem_fail", False),
    IdemCompensate: ("idem_compensate", False),
    IdemResolve: ("idem_resolve", False),
}

_SCHEDULE_QUERIES: dict[type[Any], str] = {
    ScheduleRegister: "schedule_register",
    ScheduleAdvance: "schedule_advance",
    ScheduleMade: "schedule_made",
}


class ContextVerbs(SqlStatements):
    """Storage verbs of the recording context, shared by every SQL backend."""

    # -- state ------------------------------------------------------------------------------

    def entity_get(self, query: EntityGet) -> EntityRecord | None:
        """A version of an entity: at an HLC point, a version asked, or its current one,
        the head joined to its version row in one statement (``entity_head_version``: one
        snapshot, so that a read outside a transaction, ``SnapshotRead``, needs no other;
        every ``ctx.state.get`` of an entity that exists reads it so)."""
        where = {"branch": query.branch, "namespace": query.namespace, "key": query.key}
        if query.at_hlc is not None:
            row = self.fetchone("entity_version_at", {**where, "hlc": query.at_hlc})
        elif query.version is None:
            row = self.fetchone("entity_head_version", where)
        else:
            row = self.fetchone("entity_version_get", {**where, "version": query.version})
        return None if row is None else record(EntityRecord, row)

    def entity_list(self, query: EntityFilter) -> list[EntityRecord]:
        if query.job_id is not None:
            rows = self.fetchall("entity_versions_by_job", {"job_id": query.job_id})
        else:
            where = {
                "branch": query.branch,
                "namespace": query.namespace,
                "key": query.key,
                "version": query.after_version,
            }
            rows = self.fetchall("entity_versions_after", where)
        return [record(EntityRecord, r) for r in rows]

    def entity_put(
        self, row: EntityRecord, expected_version: int | None, *, copy_on_write: bool = False
    ) -> bool:
        """Compare-and-set the head from ``expected_version`` (0: new) and insert the version;
        ``None``: insert the version only (importing a recorded case). ``copy_on_write``:
        a branch's head, started if the branch has none yet (``branch_head_put``)."""
        if expected_version is not None:
            head = {
                "branch": row.branch,
                "namespace": row.namespace,
                "key": row.key,
                "new_version": row.version,
                "expected_version": expected_version,
                "hlc": row.hlc,
            }
            if copy_on_write:
                moved = self.branch_head_put(head)
            else:
                query = "entity_head_insert" if expected_version == 0 else "entity_head_cas"
                moved = self.changed(query, head)
            if not moved:
                return False
        # A new entity's row has no parent version, and most none of data_ref and
        # fencing_token either.
        self.send("entity_version_insert", query_params(row), nullable=True)
        return True

    def branch_head_put(self, head: dict[str, Any]) -> bool:
        """A branch's head of an entity moved to ``head``'s ``new_version``: started if the
        branch has none yet (until its first write it reads the entity through to its
        base), else compare-and-set from ``expected_version``; looked up first."""
        where = EntityGet(head["branch"], head["namespace"], head["key"])
        if self.entity_get(where) is None:
            return self.changed("entity_head_insert", head)
        query = "entity_head_insert" if head["expected_version"] == 0 else "entity_head_cas"
        return self.changed(query, head)

    def branch_create(self, change: BranchCreate, versions: Sequence[EntityRecord] = ()) -> None:
        self.execute("branch_create", query_params(change))
        if not versions:
            return
        heads = {(row.namespace, row.key): row for row in versions}  # each entity's last
        self.executemany("entity_version_insert", [query_params(row) for row in versions])
        self.executemany(
            "entity_head_create",
            [
                {
                    "branch": row.branch,
                    "namespace": row.namespace,
                    "key": row.key,
                    "version": row.version,
                    "hlc": row.hlc,
                }
                for row in heads.values()
            ],
        )

    def branch_get(self, branch: str) -> Branch | None:
        row = self.fetchone("branch_get", {"branch": branch})
        return None if row is None else record(Branch, row)

    # -- locks ------------------------------------------------------------------------------

    def lock_transition(self, change: LockChange) -> Any:
        if isinstance(change, LockAcquire):
            row = self.fetchone("lock_acquire", _lock_params(change))
            return None if row is None else LockGrant(int(row["fencing_token"]), int(row["hlc"]))
        if isinstance(change, LockRenew):
            return self.changed("lock_renew", _lock_params(change))
        if isinstance(change, LockReleaseInTime):
            return self.changed("lock_release_in_time", _lock_params(change))
        bound = _lock_timeout(change.wait)
        if change.owner_token is None:
            values = {"resource": change.resource, "hlc": change.hlc, "lock_timeout": bound}
            row = self.fetchone("lock_break", values)
        else:
            row = self.fetchone("lock_release", {**query_params(change), "lock_timeout": bound})
        return None if row is None else record(Lock, row)

    def lock_list(self, query: LockFilter) -> list[Lock]:
        if query.resource is not None:
            # A write's fence reads the row as it stays until the commit (``lock_fence``:
            # on PostgreSQL FOR SHARE), so the lock is not taken again before the write lands.
            name = "lock_get" if query.newer_than is None else "lock_fence"
            row = self.fetchone(name, {"resource": query.resource, "lock_now": query.now})
            if row is None:
                return []
            lock = record(Lock, row)
            if query.newer_than is not None and lock.fencing_token <= query.newer_than:
                return []
            return [lock]
        return [record(Lock, r) for r in self.fetchall("lock_list")]

    # -- idempotency records ----------------------------------------------------------------

    def idem_transition(self, change: IdemChange) -> bool:
        query, returns_row = _IDEM_QUERIES[type(change)]
        if returns_row:
            # Whether a row came back: not made into a dictionary (``fetchone``).
            return self.execute(query, query_params(change)).fetchone() is not None
        return self.changed(query, query_params(change))

    def idem_list(self, query: IdemFilter) -> list[IdemRecord]:
        if query.key is not None and query.now is not None:
            lease = lease_now(query.now, query.database_clock)
            row = self.fetchone("idem_get_judged", {"key": query.key, "lease_now": lease})
            rows = [] if row is None else [row]
        elif query.key is not None:
            row = self.fetchone("idem_get", {"key": query.key})
            rows = [] if row is None else [row]
        elif query.job_id is not None:
            rows = self.fetchall("idem_by_job", {"job_id": query.job_id})
        else:
            values = {
                "operation": query.operation,
                "in_doubt": query.in_doubt,
                "limit": query.limit,
            }
            rows = self.fetchall("idem_list", values)
        return [record(IdemRecord, r) for r in rows]

    # -- cache ------------------------------------------------------------------------------

    def cache_update(self, change: CacheChange) -> None:
        if isinstance(change, CachePut):
            self.execute("cache_put", query_params(change))
        elif change.base_key is not None:
            self.execute("cache_delete_base", {"base_key": change.base_key})
        else:
            self.execute("cache_delete_source", {"namespace": change.namespace, "key": change.key})

    def cache_get(self, query: CacheLookup) -> CacheRecord | None:
        if query.key is not None:
            row = self.fetchone("cache_get", {"key": query.key, "now": query.now})
        else:
            row = self.fetchone("cache_latest", {"base_key": query.base_key, "now": query.now})
        return None if row is None else record(CacheRecord, row)

    # -- outbox -----------------------------------------------------------------------------

    def outbox_update(self, change: OutboxChange) -> bool:
        """Insert a row (``False`` when its ``event_id`` exists), or mark a claimed one."""
        if isinstance(change, OutboxInsert):
            return self.changed("outbox_insert", query_params(change))
        if change.error is None:
            return self.changed("outbox_mark_published", {"id": change.row_id, "now": change.now})
        return self.changed("outbox_mark_failed", {"id": change.row_id, "error": change.error})

    def outbox_claim(self, query: OutboxClaim) -> list[OutboxRecord]:
        return [record(OutboxRecord, r) for r in self.fetchall("outbox_claim", query_params(query))]

    def outbox_by_job(self, job_id: int) -> list[OutboxRecord]:
        return [record(OutboxRecord, r) for r in self.fetchall("outbox_by_job", {"job_id": job_id})]

    # -- steps ------------------------------------------------------------------------------

    def step_complete(self, params: StepComplete) -> bool:
        """Record a committed step; ``False`` when its position was already recorded."""
        return self.changed("step_complete", query_params(params))

    def step_by_job(self, job_id: int) -> list[StepRecord]:
        return [record(StepRecord, r) for r in self.fetchall("step_by_job", {"job_id": job_id})]

    # -- blobs ------------------------------------------------------------------------------

    # The key is stored as the SHA-256's 32 bytes (migration 0026), half its hex, in the
    # row and in its index; a reference (and ``BlobPut.hash``) keeps the hex. A
    # ``bytearray``, as a blob's body (recording/blobs.py): the ``sqlite3`` driver binds it
    # at once, ``bytes`` after a failed adapter lookup.

    def blob_put(self, change: BlobPut) -> None:
        values = query_params(change)
        values["hash"] = bytearray.fromhex(change.hash)
        self.send("blob_put", values)

    def blob_get(self, digest: str) -> Blob | None:
        try:
            key = bytearray.fromhex(digest)
        except ValueError:  # not a hash in hex: no blob is stored under it
            return None
        row = self.fetchone("blob_get", {"hash": key})
        return None if row is None else Blob(str(row["codec"]), bytes(row["body"]))

    # -- lineage ----------------------------------------------------------------------------

    def lineage_put(self, change: LineagePut) -> None:
        self.execute("lineage_put", query_params(change))

    def lineage_list(self, query: LineageQuery) -> list[LineageRecord]:
        if query.after is not None:
            created_at, trace_id = query.after
            values = {"created_at": created_at, "trace_id": trace_id, "limit": query.limit}
            rows = self.fetchall("lineage_page", values)
        else:
            where = {"trace_id": query.trace_id, "source_trace_id": query.source_trace_id}
            rows = self.fetchall("lineage_list", where)
        return [record(LineageRecord, r) for r in rows]

    # -- schedules --------------------------------------------------------------------------

    def schedule_update(self, change: ScheduleChange) -> bool:
        return self.changed(_SCHEDULE_QUERIES[type(change)], query_params(change))

    def schedule_list(self, name: str | None = None) -> list[ScheduleRecord]:
        return [record(ScheduleRecord, r) for r in self.fetchall("schedule_list", {"name": name})]


def lease_now(now: float, database_clock: bool) -> float | None:
    """The ``lease_now``/``lock_now`` parameter of the lease and lock queries: ``NULL`` lets
    the database's own clock judge (``COALESCE(:lease_now, <the database's now>)``)."""
    return None if database_clock else now


def _lock_params(change: LockAcquire | LockRenew | LockReleaseInTime) -> dict[str, Any]:
    """The change's fields plus ``lock_now``, judged like a job's lease (``lease_now``), and
    ``lock_timeout`` (``_lock_timeout``)."""
    return {
        **query_params(change),
        "lock_now": lease_now(change.now, change.database_clock),
        "lock_timeout": _lock_timeout(change.wait),
    }


def _lock_timeout(wait: float | None) -> str | None:
    """The ``lock_timeout`` parameter of the statements that write a lock's row: its
    ``wait`` as PostgreSQL's setting (``lock_timeout_ms``), which a renewal, a release and
    a break set for the rest of their transaction in their own statement (``locks.sql``);
    ``None``: no bound. SQLite's statements do not read it."""
    return None if wait is None else f"{lock_timeout_ms(wait)}ms"
