"""Versioned, copy-on-write entity state.

Every write makes a new version with a parent pointer and a delta against the
parent; entities that are not written are never copied. Writes are optimistic
(``expected_version``) and, under a lock, fenced. A branch (replay, fork) reads
through to its base branch as of the branch point for entities it has not written.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import Struct

from replayq import codec
from replayq.recording.attempt import ENDED, Attempt, Refusal, ended_error
from replayq.recording.blobs import load_json
from replayq.recording.world import LIVE
from replayq.redaction import Redactor
from replayq.runtime import RuntimeSource
from replayq.storage.context_params import LockFilter
from replayq.storage.protocol import (
    BranchCreate,
    EntityFilter,
    EntityGet,
    EntityRecord,
    SnapshotRead,
    Transaction,
)

MAIN = "main"


@dataclass(frozen=True)
class Entity:
    """One version of an entity. ``version == 0`` means it does not exist yet."""

    namespace: str
    key: str
    version: int
    data: Any

    @property
    def exists(self) -> bool:
        return self.version > 0

    @property
    def resource(self) -> str:
        return resource_name(self.namespace, self.key)


class EntityVersion(Struct, frozen=True):
    """A stored version with its provenance, as ``history()`` lists it."""

    namespace: str
    key: str
    version: int
    parent_version: int | None
    data: Any
    delta: dict[str, Any]
    job_id: int | None
    trace_id: str | None
    attempt: int | None
    fencing_token: int | None
    created_at: float
    branch: str


def resource_name(namespace: str, key: str) -> str:
    return f"{namespace}:{key}"


# A version row's ``delta`` when it replaces the whole value with the row's own data (a new
# entity, a value that is not an object): JSON ``null`` instead of ``{"replace": data}``,
# which stored the value a second time in the same row (a large value in the blob store a
# second time inline). A real delta is always an object, so ``null`` is unambiguous; rows
# written before keep their full delta, and ``version_from_row`` reads both.
WHOLE_DATA = "null"


def delta_of(old: Any, new: Any) -> dict[str, Any]:
    """Field-level delta for objects (``set``/``unset``); a whole replacement otherwise."""
    if isinstance(old, dict) and isinstance(new, dict):
        changed = {k: v for k, v in new.items() if k not in old or old[k] != v}
        removed = sorted(k for k in old if k not in new)
        return {"set": changed, "unset": removed}
    return {"replace": new}


def _delta_screened(redactor: Redactor, delta: dict[str, Any], data: Any, inline: Any) -> bool:
    """Whether ``delta`` (``delta_of(previous, data)``) holds nothing the redactor would
    change, known without encoding it: ``data`` came out of ``encoded`` unchanged (the
    same object: nothing in it is secret), ``set`` and ``replace`` hold its own keys and
    values, so only the names of removed fields and ``delta_of``'s own keys are left to
    screen."""
    if inline is not data or redactor.any_secret_field(delta):
        return False
    removed = delta.get("unset")
    return not removed or redactor.value(removed) is removed


def version_from_row(tx: Transaction, row: EntityRecord, *, delta: bool = True) -> EntityVersion:
    """The version ``row`` holds; without ``delta`` its delta is not decoded (``{}``): a
    job's read takes the data only."""
    return EntityVersion(
        namespace=row.namespace,
        key=row.key,
        version=row.version,
        parent_version=row.parent_version,
        data=(data := load_json(tx, codec.loads(row.data), row.data_ref)),
        delta=({"replace": data} if row.delta == WHOLE_DATA else codec.loads(row.delta))
        if delta
        else {},
        job_id=row.job_id,
        trace_id=row.trace_id,
        attempt=row.attempt,
        fencing_token=row.fencing_token,
        created_at=row.created_at,
        branch=row.branch,
    )


def read_entity(
    tx: Transaction,
    branch: str,
    namespace: str,
    key: str,
    base: tuple[str, int] | None = None,
    *,
    delta: bool = True,
) -> tuple[EntityVersion | None, int]:
    """The current version on ``branch`` (reading through to its base), and the head HLC.

    ``base``: (base branch, base HLC) of a branch whose row is not written yet. Without
    ``delta`` the version's delta is not decoded (``version_from_row``).
    """
    head = tx.entity_get(EntityGet(branch, namespace, key))
    if head is not None:
        # The head moves with its newest version: that version's HLC is the head's.
        return version_from_row(tx, head, delta=delta), head.hlc
    if branch == MAIN:
        return None, 0
    info = tx.branch_get(branch)
    if info is not None:
        base = (info.base_branch, info.base_hlc)
    if base is None:
        return None, 0
    row = tx.entity_get(EntityGet(base[0], namespace, key, at_hlc=base[1]))
    if row is None:
        return None, 0
    return version_from_row(tx, row, delta=delta), row.hlc


class StateStore:
    """Read access to entity state from outside a job (``runtime.state``)."""

    def __init__(self, source: RuntimeSource, branch: str = MAIN) -> None:
        runtime = source.runtime
        self._app = runtime
        self.branch = branch

    def get(self, namespace: str, key: Any) -> Entity:
        with self._app.storage.transaction(readonly=True) as tx:
            found, _ = read_entity(tx, self.branch, namespace, str(key))
        if found is None:
            return Entity(namespace, str(key), 0, None)
        return Entity(namespace, str(key), found.version, found.data)

    def history(self, namespace: str, key: Any) -> list[EntityVersion]:
        """Every version on this branch, oldest first, with the job and trace that wrote it."""
        with self._app.storage.transaction(readonly=True) as tx:
            rows = tx.entity_list(
                EntityFilter(branch=self.branch, namespace=namespace, key=str(key))
            )
            return [version_from_row(tx, row) for row in rows]

    def put(self, namespace: str, key: Any, data: Any, *, expected_version: int) -> Entity:
        """Write outside a job (seeding, repair): a compare-and-set making a new version."""
        from replayq.errors import ConcurrencyError

        now, hlc = self._app.clock.now(), self._app.hlc.tick()
        with self._app.storage.transaction() as tx:
            current, _ = read_entity(tx, self.branch, namespace, str(key))
            actual = current.version if current else 0
            if actual != expected_version:
                raise ConcurrencyError(
                    f"{resource_name(namespace, str(key))}: expected version {expected_version}, "
                    f"found {actual}"
                )
            row = version_row(
                self.branch, namespace, str(key), actual + 1, current, data, now=now, hlc=hlc
            )
            # A branch reads an entity through to its base until it writes it: its first
            # write starts the branch's head (copy-on-write), as a fork's step does.
            if not tx.entity_put(row, actual, copy_on_write=self.branch != MAIN):
                raise ConcurrencyError(f"{resource_name(namespace, str(key))}: write raced")
        return Entity(namespace, str(key), actual + 1, data)


def version_row(
    branch: str,
    namespace: str,
    key: str,
    version: int,
    parent: EntityVersion | None,
    data: Any,
    *,
    now: float,
    hlc: int,
    job_id: int | None = None,
    trace_id: str | None = None,
    attempt: int | None = None,
    fencing_token: int | None = None,
    data_ref: str | None = None,
    data_json: str | None = None,
    delta: dict[str, Any] | None = None,
) -> EntityRecord:
    """The row for a new version (``data`` inline unless ``data_ref`` points to a blob).

    ``data_json`` is ``data`` already checked and encoded (``Context.encoded_as_written``)
    and ``delta`` the delta already computed: neither is walked or computed again. A
    delta that replaces the whole value is stored as ``WHOLE_DATA``: its value is the
    row's data.
    """
    if data_ref:
        data_text = None
    elif data_json is not None:
        data_text = data_json
    else:
        data_text = codec.dumps(data, what=resource_name(namespace, key))
    if delta is None:
        delta = delta_of(parent.data if parent else None, data)
    return EntityRecord(
        branch=branch,
        namespace=namespace,
        key=key,
        version=version,
        parent_version=parent.version if parent else None,
        data=data_text,
        data_ref=data_ref,
        # Built from checked values (the new data, a stored version): no second walk.
        delta=WHOLE_DATA if "replace" in delta else codec.dumps_own(delta),
        job_id=job_id,
        trace_id=trace_id,
        attempt=attempt,
        fencing_token=fencing_token,
        created_at=now,
        hlc=hlc,
    )


# Whether a storage has ``SnapshotRead``, by storage (a weak reference to it, and the
# answer): a protocol's ``isinstance`` looks up each of its members, which every read
# would pay. Bounded.
_SNAPSHOT_READS: dict[int, tuple[Callable[[], object], bool]] = {}


def _snapshot_reads(storage: object) -> bool:
    """``isinstance(storage, SnapshotRead)``, asked once per storage."""
    known = _SNAPSHOT_READS.get(id(storage))
    if known is not None and known[0]() is storage:
        return known[1]
    can = isinstance(storage, SnapshotRead)
    try:
        ref = weakref.ref(storage)
    except TypeError:  # a storage without weak references: asked each time
        return can
    if len(_SNAPSHOT_READS) >= 64:
        _SNAPSHOT_READS.clear()
    _SNAPSHOT_READS[id(storage)] = (ref, can)
    return can


def _head_read(storage: Any, namespace: str, key: str) -> tuple[int, int, Any] | None:
    """The current version of a main-branch entity as ``(version, head HLC, data)`` (``(0,
    0, None)`` if it does not exist), read by one statement without a transaction around
    it where the storage can (``SnapshotRead``: SQLite, PostgreSQL), or ``None``: then
    read it in a read-only transaction (as well a version whose data is in the blob
    store, a second statement that must see the same snapshot)."""
    if not _snapshot_reads(storage):
        return None
    with storage.snapshot_read() as tx:
        head = tx.entity_get(EntityGet(MAIN, namespace, key))
    if head is None:
        return 0, 0, None
    if head.data_ref is not None:
        return None
    return head.version, head.hlc, codec.loads(head.data)


class StateView:
    """``ctx.state``: reads and writes of versioned entities inside a job."""

    def __init__(self, ctx: Attempt) -> None:
        self._ctx = ctx
        self._read_versions: dict[tuple[str, str], int] = {}
        self._read: dict[tuple[str, str], Entity] = {}
        self._pending: dict[tuple[str, str], Entity] = {}

    def discard_pending(self, resources: set[str | None] | None = None) -> None:
        """Forget the puts not committed: all, or those of ``resources`` (``ns:key``)."""
        if resources is None:
            self._pending.clear()
            return
        for ident in [i for i in self._pending if f"{i[0]}:{i[1]}" in resources]:
            del self._pending[ident]

    def get(self, namespace: str, key: Any) -> Entity:
        """The current version (your own uncommitted writes first); the read is recorded."""
        ctx, key = self._ctx, str(key)
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.state.get({namespace!r}, {key!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        ident = (namespace, key)
        if ident in self._pending:
            return self._pending[ident]
        world = ctx.world
        resource = f"{namespace}:{key}"  # ``resource_name``
        recorded = world.state_version(resource) if world.reads_recorded else None
        held = LIVE if not recorded else world.recorded_state(resource, recorded)
        if recorded == 0 or held is not LIVE:
            # The version the attempt read, already loaded with the recording: no read here.
            entity = Entity(namespace, key, recorded or 0, held if recorded else None)
            return self._recorded_read(ident, entity, resource)
        # The ``state.read`` event waits with the step's other events and commits with the
        # attempt's next commit (docs/recording-context.md, "What a crash can lose").
        storage = ctx.runtime.storage
        if recorded is None and ctx.branch == MAIN:
            head = _head_read(storage, namespace, key)
            if head is not None:
                version, head_hlc, data = head
                ctx.runtime.hlc.observe(head_hlc)
                return self._recorded_read(ident, Entity(namespace, key, version, data), resource)
        with storage.transaction(readonly=True) as tx:
            if recorded is not None:
                row = tx.entity_get(EntityGet(MAIN, namespace, key, version=recorded))
                found = version_from_row(tx, row, delta=False) if row else None
                head_hlc = 0
            else:
                found, head_hlc = read_entity(
                    tx, ctx.branch, namespace, key, ctx.branch_base, delta=False
                )
        ctx.runtime.hlc.observe(head_hlc)
        entity = Entity(
            namespace, key, found.version if found else 0, found.data if found else None
        )
        return self._recorded_read(ident, entity, resource)

    def _recorded_read(self, ident: tuple[str, str], entity: Entity, resource: str) -> Entity:
        """Remember a read and record its ``state.read`` event (it commits with the step).
        ``resource``: the entity's (``entity.resource``, which the caller made already)."""
        version = entity.version
        self._read_versions[ident] = version
        self._read[ident] = entity
        ctx = self._ctx
        # In the trace with the ack, or the read refused (``_hold_read``): a thread the
        # handler left running never gets a value whose read the trace does not hold.
        lock = ctx._hold_read()
        try:
            ctx.record_read(resource, version, version > 0, ctx.branch)
        finally:
            lock.release()
        return entity

    def put(
        self, namespace: str, key: Any, data: Any, *, expected_version: int | None = None
    ) -> Entity:
        """Write a new version when the step commits.

        ``expected_version`` defaults to the version this job read (optimistic);
        a mismatch raises ``ConcurrencyError`` with expected and actual versions.
        Under a lock the write carries the lock's fencing token and is rejected
        (``StaleFencingTokenError``) if the lock has been re-acquired since. A replay's
        write carries the token the recorded lock had and is rejected only where the
        recorded write was (``World.write_rejection``).
        """
        ctx, key = self._ctx, str(key)
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.state.put({namespace!r}, {key!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        ident = (namespace, key)
        resource = f"{namespace}:{key}"  # ``resource_name``
        if expected_version is None:
            pending = self._pending.get(ident)
            expected_version = pending.version if pending else self._read_versions.get(ident, -1)
        # Redacted for the trace (the ``state.write`` event's delta); the version row keeps
        # the value as written: the application reads it back (docs/secrets.md).
        (inline, _, _, _), stored = ctx.encoded_as_written(data, what=f"state {resource}")
        if not ctx.world.writes_apply:
            return self._record_only(namespace, key, data, expected_version)
        seen = self._read.get(ident)
        current: EntityVersion | None = None
        if seen is None and ident not in self._pending:
            # A write without a read first: the head as ``get`` reads it (one statement,
            # no transaction: ``_head_read``) where it can, else in a read-only transaction.
            head = _head_read(ctx.runtime.storage, namespace, key) if ctx.branch == MAIN else None
            if head is not None:
                seen = Entity(namespace, key, head[0], head[2])
            else:
                with ctx.runtime.storage.transaction(readonly=True) as tx:
                    current, _ = read_entity(
                        tx, ctx.branch, namespace, key, ctx.branch_base, delta=False
                    )
        if seen is not None:
            # Written on top of the version this attempt read (or the head just read),
            # without reading the head again: the step's commit is a compare-and-set on
            # that version anyway (a newer head fails it with ``ConcurrencyError`` then).
            # A dry-run's read is the version the attempt read, even if another worker
            # wrote after the branch point.
            # Its fields by position, as ``parent`` below (~0.4 K instructions fewer a
            # write than by name): the data and version seen, no provenance, on main.
            current = (
                EntityVersion(
                    namespace,
                    key,
                    seen.version,
                    None,
                    seen.data,
                    {},
                    None,
                    None,
                    None,
                    None,
                    0,
                    MAIN,
                )
                if seen.exists
                else None
            )
        actual = current.version if current else 0
        pending = self._pending.get(ident)
        base = pending.version if pending else actual
        if expected_version not in (-1, base):
            # Its ``state.conflict`` in the trace, or the put refused (``_hold_pending``).
            lock = ctx._hold_pending()
            try:
                self._conflict(resource, expected_version, base)
            finally:
                lock.release()
        previous = pending.data if pending else (current.data if current else None)
        if base > 0 and previous == data:
            # Copy-on-write: an unchanged entity gets no new version. Its event in the
            # trace, or the put refused (``_hold_pending``).
            lock = ctx._hold_pending()
            try:
                ctx.record("state.unchanged", resource=resource, resource_version=base)
            finally:
                lock.release()
            return Entity(namespace, key, base, data)
        new_version = base + 1
        fences = ctx.fences()
        delta = delta_of(previous, data)
        # Its event and its write join the pending record together, or it is refused: not
        # across the attempt's end, whose ack or failure, flushed after the end, would
        # otherwise forget a write a thread the handler left running joined after that
        # flush (``put`` returned, nothing written): ``_hold_pending``.
        lock = ctx._hold_pending()
        try:
            event = ctx.record_screened(
                "state.write",
                ("delta",) if _delta_screened(ctx.redactor, delta, data, inline) else (),
                resource=resource,
                resource_version=new_version,
                parent_version=base,
                expected_version=expected_version if expected_version != -1 else None,
                delta=delta,
                fencing=dict(fences) or None,
                branch=ctx.branch,
            )
            if stored.raw is not None:
                ctx.store_blob(stored.raw, f"state {resource}", stored.ref)
            parent = (
                EntityVersion(
                    namespace, key, base, None, pending.data, {}, None, None, None, None, 0, ""
                )
                if pending
                else current
            )
            token = max(fences.values()) if fences else None
            # A replay is told whether fencing rejected this write in the recording. A live
            # world has no recording to tell (``LiveWorld.write_rejection``) and is not
            # asked: a call less at every write, which pays for ``_hold_pending``'s.
            world = ctx.world
            live = world.is_live
            rejection = None if live else world.write_rejection(resource)
            if isinstance(rejection, dict):
                ctx.defer(
                    Refusal(
                        lambda: self._stale(
                            resource,
                            str(rejection.get("lock")),
                            int(rejection.get("fencing_token") or 0),
                            int(rejection.get("newest_token") or 0),
                        )
                    ),
                    f"state {resource} v{new_version}",
                )
                entity = Entity(namespace, key, new_version, data)
                self._pending[ident] = entity
                return entity

            def row() -> EntityRecord:
                return version_row(
                    ctx.branch,
                    namespace,
                    key,
                    new_version,
                    parent,
                    stored.inline,
                    now=event.ts,
                    hlc=event.hlc,
                    job_id=ctx.job.id,
                    trace_id=ctx.trace_id,
                    attempt=ctx.attempt,
                    fencing_token=token,
                    data_ref=stored.ref,
                    data_json=stored.text,
                    delta=delta,
                )

            # Only a live attempt holds real locks. A replay (dry-run, fork) holds none: its
            # tokens are the recording's, and the lock table as it is now (a lock taken again
            # after the recording) says nothing about a write of the past; the recording said
            # whether fencing rejected it (``write_rejection`` above).
            write = StateWrite(self, resource, row, base, fences if live else {})
            ctx.defer(write, f"state {resource} v{new_version}", pipelines=True)
            entity = Entity(namespace, key, new_version, data)
            self._pending[ident] = entity
            return entity
        finally:
            lock.release()

    def _record_only(self, namespace: str, key: str, data: Any, expected: int) -> Entity:
        """Before a fork point: the branch already holds this write; only record it."""
        ctx = self._ctx
        ident = (namespace, key)
        pending = self._pending.get(ident)
        base = pending.version if pending else max(self._read_versions.get(ident, 0), expected, 0)
        read = self._read.get(ident)
        delta = delta_of(pending.data if pending else (read.data if read else None), data)
        # In the derived trace's last commit, or refused, as a live write (``_hold_pending``).
        lock = ctx._hold_pending()
        try:
            ctx.record(
                "state.write",
                resource=resource_name(namespace, key),
                resource_version=base + 1,
                parent_version=base,
                delta=delta,
                replayed=True,
            )
            entity = Entity(namespace, key, base + 1, data)
            self._pending[ident] = entity
        finally:
            lock.release()
        return entity

    def history(self, namespace: str, key: Any) -> list[EntityVersion]:
        """Every version of an entity on this job's branch, with the job that wrote it."""
        ctx = self._ctx
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.state.history({namespace!r}, {str(key)!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        return StateStore(ctx.runtime, ctx.branch).history(namespace, key)

    def _conflict(self, resource: str, expected: int, actual: int) -> None:
        from replayq.errors import ConcurrencyError

        self._ctx.record(
            "state.conflict", status="fail", resource=resource, expected=expected, actual=actual
        )
        raise ConcurrencyError(
            f"{resource}: expected version {expected}, found {actual} "
            "(another writer got there first)"
        )

    def _stale(self, resource: str, lock: str, token: int, newest: int) -> None:
        from replayq.errors import StaleFencingTokenError

        self._ctx.record(
            "state.write_rejected",
            status="fail",
            resource=resource,
            lock=lock,
            fencing_token=token,
            newest_token=newest,
        )
        raise StaleFencingTokenError(
            f"write to {resource} rejected: fencing token {token} of lock {lock!r} is older "
            f"than the newest ({newest}); the lock was re-acquired by another holder"
        )


class StateWrite:
    """A new version of an entity, written by the commit of its step (``Recorder.defer``).

    Called with that commit's transaction it checks ``fences`` (the fencing token of every
    lock a live attempt holds; none in a replay) against the lock table, then
    compare-and-sets the head from ``base`` (a branch's first write of an entity starts
    its own head: copy-on-write) and inserts the version. A dry-run, whose
    branch is created by the one transaction that writes its end, keeps its writes and
    writes them with its branch instead (``branch_with_writes``).
    """

    __slots__ = ("base", "fences", "resource", "row", "view")

    def __init__(
        self,
        view: StateView,
        resource: str,
        row: Callable[[], EntityRecord],
        base: int,
        fences: dict[str, int],
    ) -> None:
        self.view = view
        self.resource = resource
        # The version's row, built when it is written: a write that is never (a failed
        # step's, a dry-run that keeps nothing) costs no encoding of its delta.
        self.row = row
        self.base = base
        self.fences = fences

    def __call__(self, tx: Transaction) -> None:
        if self.fences:
            self.check_fences(tx)
        row = self.row()
        # A branch's first write of an entity starts its head there (copy-on-write).
        if not tx.entity_put(row, self.base, copy_on_write=row.branch != MAIN):
            head = tx.entity_get(EntityGet(row.branch, row.namespace, row.key))
            self.view._conflict(self.resource, self.base, head.version if head else 0)

    def check_fences(self, tx: Transaction) -> None:
        """``StaleFencingTokenError`` if a lock the write is under was re-acquired since.

        Asked as "the lock if its token is newer than ours" (``LockFilter.newer_than``): in
        a commit in one round trip (PostgreSQL) the question is sent unread and refuses in
        the server; the commit made again asks it here, answer read, and says so. Either
        way the lock's row stays as read until ``tx`` ends (PostgreSQL: ``FOR SHARE``), so
        nobody takes the lock again before this write commits."""
        for lock_resource, fencing_token in self.fences.items():
            for newer in tx.lock_list(LockFilter(lock_resource, newer_than=fencing_token)):
                self.view._stale(self.resource, lock_resource, fencing_token, newer.fencing_token)


def branch_with_writes(tx: Transaction, branch: BranchCreate, writes: Sequence[StateWrite]) -> None:
    """Create ``branch`` in ``tx`` with the versions ``writes`` made on it before it was
    stored (a dry-run's, at its end), as their steps' commits one by one would have left
    it, in as few statements (``Transaction.branch_create``).

    Their compare-and-sets could only have compared with the run's own earlier writes (no
    one else knows the branch), and ``StateView.put`` checked each write against those
    when it was made. Nothing is checked against the lock table: a dry-run holds no real
    lock, and what fencing did to each write is the recording's answer (a write it
    rejected then is rejected at its step's commit, never written here).
    """
    tx.branch_create(branch, [write.row() for write in writes])
