"""Lease locks with owner tokens and monotonic fencing tokens.

Acquiring a lock is an upsert that succeeds only when the lock is free or its
lease has expired; each acquisition increments the resource's fencing token.
Release is a compare-and-release on the owner token. State writes made while a
lock is held carry its fencing token, and the store rejects a token older than
the lock's newest; a write that passes commits before the lock can be taken again
(the lock may guard another entity than the one written): on PostgreSQL its fence
keeps the lock's row FOR SHARE until the commit, and an acquisition meanwhile waits
for it; on SQLite the commit's write lock holds off every acquisition anyway.
Acquisition and release commit at once, so other workers see them; the worker's
heartbeat renews held locks. A lock let go of while writes carrying its token wait for
their commit is released by that commit instead, after them (``release``): until they
land nobody takes it and reads what they are about to change.

This module acquires and renews; the releases (at once, deferred to that commit, or
abandoned when it never comes) are in ``lock_release.py``.

On PostgreSQL a commit that fences a write under a lock holds the lock's row until it
ends, and a worker frozen inside a commit in one round trip holds it until it thaws or
its session ends: every statement that writes the row waits for it at most a bound
(``lock_timeout``), then fails with ``RowLockTimeoutError`` and changes nothing. An
acquisition's bound is what is left of its ``wait``; a renewal's (the heartbeat's) the
lock's ``wait`` and at most one heartbeat interval; a release's on its own the lock's
``wait`` (``lock_release.py``); ``break_lock``'s its own ``wait``.
"""

from __future__ import annotations

import math
import time
import uuid
from functools import partial
from types import TracebackType
from typing import Any

from msgspec import Struct

from replayq.durations import parse_duration
from replayq.errors import ConfigurationError, LockTimeoutError, RowLockTimeoutError, StorageError
from replayq.model import TraceEvent
from replayq.queue.contracts import LockHold
from replayq.recording.attempt import ENDED, Attempt, ended_error
from replayq.recording.lock_release import (
    ROW_WAIT_FLOOR,
    TAKEN,
    LockReleases,
    acquisition_order,
    row_held,
    row_wait,
)
from replayq.recording.world import LIVE
from replayq.runtime import RuntimeSource
from replayq.storage.commits import commit_at_once
from replayq.storage.context_params import LockFilter, LockRelease, LockRenew
from replayq.storage.protocol import (
    JobFilter,
    Lock,
    LockAcquire,
    LockGrant,
    TraceQuery,
    Transaction,
    lock_get,
)

DEFAULT_WAIT_SECONDS = 10.0
_POLL_SECONDS = 0.05


class LockInfo(Struct, frozen=True):
    """A lock as ``replayq locks list`` shows it."""

    resource: str
    owner_token: str | None
    fencing_token: int
    job_id: int | None
    worker_id: str | None
    acquired_at: float | None
    expires_at: float | None


def _info(row: Lock) -> LockInfo:
    return LockInfo(
        row.resource,
        row.owner_token,
        row.fencing_token,
        row.job_id,
        row.worker_id,
        row.acquired_at,
        row.expires_at,
    )


class LockHandle:
    """One lock held (or about to be) by a job; use as a context manager."""

    def __init__(self, manager: LockManager, resource: str, ttl: float, wait: float) -> None:
        self._manager = manager
        self.resource = resource
        self.ttl = ttl
        self.wait = wait
        self.owner_token = uuid.uuid4().hex
        self.fencing_token: int | None = None
        # Its place among the attempt's acquisitions: the order its row is renewed and
        # released in with others (``LockManager.renew_all``, ``_release_waiting``).
        self.order = 0
        # A release waiting for the commit of writes under the lock: its ``lock.released``
        # as built, and as it is pending now (``lock.expired`` once its commit said so).
        self.release_event: TraceEvent | None = None
        self.recorded: TraceEvent | None = None
        # Until when the lock is surely this handle's, in ``LockManager._lock_clock``: read
        # before the statement that granted or last renewed it was sent, plus its TTL, so
        # it errs early; ``-inf`` once a renewal found it lost. A take-back past it asks
        # the row first (``LockManager._take_back``).
        self.held_until = -math.inf

    def __enter__(self) -> LockHandle:
        self._manager.acquire(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._manager.release(self)


class LockManager(LockReleases[LockHandle]):
    """``ctx.locks``: acquires, renews and releases the locks of one job attempt (the
    releases: ``LockReleases``, ``lock_release.py``)."""

    def __init__(self, ctx: Attempt) -> None:
        self._ctx = ctx
        self.held: dict[str, LockHandle] = {}
        # Let go of while writes under them wait for their commit: released by that commit
        # (``release``), renewed until then.
        self.waiting: dict[str, LockHandle] = {}
        self.kept: list[str] = []
        self.traced: list[TraceEvent] = []
        # Whether ``_release_waiting`` waits for the next commit (once per commit).
        self.deferred = False
        # The attempt is settled (``abandon``): no commit of it is to come, a lock let go
        # of now is released at once.
        self.ended = False
        self._acquisitions = 0

    def handle(self, resource: str, *, ttl: Any = None, wait: Any = None) -> LockHandle:
        ctx = self._ctx
        if ctx._callback is not None:
            ctx._refuse_inside(f"ctx.locks.handle({resource!r})")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        contract = ctx.handler.contract
        ttl_s = parse_duration(ttl, name=f"lock {resource} ttl") if ttl is not None else None
        if ttl_s is None:
            ttl_s = contract.lock_ttl or contract.lease * 2
        if ttl_s <= 0:
            raise ConfigurationError(f"lock {resource!r}: ttl must be positive, got {ttl!r}")
        wait_s = parse_duration(wait, name="wait") if wait is not None else DEFAULT_WAIT_SECONDS
        return LockHandle(self, resource, ttl_s, wait_s)

    def fences(self) -> dict[str, int]:
        """The fencing token of every lock this attempt holds, by resource.

        In a replay, the tokens the recorded attempt's locks had (a lock taken past a fork
        point has none): its writes carry them as the recorded writes did. Only a live
        attempt's commit checks them against the lock table (``StateView.put``).
        """
        return {r: h.fencing_token for r, h in self.held.items() if h.fencing_token is not None}

    def acquire(self, handle: LockHandle) -> None:
        """Take ``handle``'s lock (``with handle:``). Refused once the attempt ended; a
        release is not (``release``: a lock still held is let go of, not kept to its TTL)."""
        ctx = self._ctx
        if ctx._callback is not None:  # a handle kept from before: its own transaction
            ctx._refuse_inside(f"ctx.lock({handle.resource!r}) acquire")
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        runtime = ctx.runtime
        started = time.monotonic()
        recorded = ctx.world.lock_outcome("acquire", handle.resource)
        if recorded is not LIVE:
            # A replay never contends with production: it takes no real lock, and is told
            # what the lock did in the recording.
            if recorded["event"] == "lock.timeout":
                ctx.record(
                    "lock.timeout",
                    status="fail",
                    resource=handle.resource,
                    wait=recorded.get("wait"),
                    holder=recorded.get("holder"),
                    holder_job=recorded.get("holder_job"),
                    holder_token=recorded.get("holder_token"),
                    replayed=True,
                )
                raise _timeout(handle.resource, recorded, float(recorded.get("wait") or 0.0))
            handle.fencing_token = recorded.get("fencing_token")
            self.held[handle.resource] = handle
            ctx.record(
                "lock.acquired",
                resource=handle.resource,
                fencing_token=recorded.get("fencing_token"),
                ttl=handle.ttl,
                replayed=True,
            )
            return
        kept = self.waiting.pop(handle.resource, None)
        if kept is not None and self._take_back(handle, kept):
            return
        while True:
            now = runtime.clock.now()
            sent = self._lock_clock(now)  # before the acquisition is sent: ``held_until``
            hlc = runtime.hlc.tick()
            tried: list[TraceEvent] = []
            # The try waits for the lock's row at most what is left of ``wait``: a commit
            # that fences a write under the lock holds the row until it ends, and a worker
            # frozen inside one (PostgreSQL) would hold this acquisition past its wait.
            bound = max(handle.wait - (time.monotonic() - started), ROW_WAIT_FLOOR)
            try:
                grant, holder = commit_at_once(
                    runtime.storage,
                    partial(self._acquire_in, handle, now, hlc, started, tried, bound),
                )
            except RowLockTimeoutError:
                # Not granted yet: another transaction held the row (rolled back here, the
                # connection good). Asked again until ``wait`` runs out, as any refusal.
                while tried:
                    ctx.unmake(tried.pop())
                grant, holder = None, self._holder(handle.resource)
            if grant is not None:
                handle.held_until = sent + handle.ttl
                self._acquisitions += 1
                handle.order = self._acquisitions
                self.held[handle.resource] = handle
                return
            waited = time.monotonic() - started
            if waited >= handle.wait:
                ctx.record(
                    "lock.timeout",
                    status="fail",
                    resource=handle.resource,
                    wait=waited,
                    holder=holder.worker_id if holder else None,
                    holder_job=holder.job_id if holder else None,
                    holder_token=holder.fencing_token if holder else None,
                )
                raise _timeout(
                    handle.resource,
                    {
                        "holder": holder.worker_id if holder else None,
                        "holder_job": holder.job_id if holder else None,
                        "holder_token": holder.fencing_token if holder else None,
                    },
                    waited,
                )
            time.sleep(_POLL_SECONDS)

    def _acquire_in(
        self,
        handle: LockHandle,
        now: float,
        hlc: int,
        started: float,
        tried: list[TraceEvent],
        bound: float,
        tx: Transaction,
    ) -> tuple[LockGrant | None, Lock | None]:
        """One try at ``handle``'s lock in ``tx``: the grant, committed with its
        ``lock.acquired``, or the holder that keeps it. ``tried``: the event a refused
        try of the same commit built (``commit_at_once`` runs it again), unmade.

        Two round trips on PostgreSQL (``commit_at_once``): ``BEGIN`` and the upsert, whose
        fencing token the event carries; then the event and ``COMMIT``. The append of the
        event is the lease's fence: a worker whose lease was taken must not bump the
        fencing token under the new owner's feet, and its grant rolls back. ``bound``: how
        long its statements may wait for a row lock (``LockAcquire.wait``; PostgreSQL's
        ``lock_timeout``, sent with the upsert): past it ``RowLockTimeoutError``.
        """
        ctx, runtime = self._ctx, self._ctx.runtime
        while tried:
            ctx.unmake(tried.pop())
        grant = tx.lock_transition(
            LockAcquire(
                resource=handle.resource,
                owner_token=handle.owner_token,
                job_id=ctx.job.id,
                worker_id=ctx.worker_id,
                now=now,
                ttl=handle.ttl,
                hlc=hlc,
                database_clock=runtime.leases_by_database,
                wait=bound,
            )
        )
        refused = [f"lock {handle.resource}"]
        if grant is None:
            # Not granted: a lost lease says so now, rather than after the wait.
            ctx.fence(tx, refused, lock=handle.resource)
            return None, lock_get(tx, handle.resource)
        runtime.hlc.observe(grant.hlc)
        handle.fencing_token = grant.fencing_token
        event = ctx.event(
            "lock.acquired",
            resource=handle.resource,
            fencing_token=handle.fencing_token,
            owner_token=handle.owner_token,
            ttl=handle.ttl,
            wait=time.monotonic() - started,
        )
        tried.append(event)
        if not tx.trace_append([event], ctx.trace_fence()):
            ctx.unmake(tried.pop())
            ctx.refuse(refused, lock=handle.resource)
        return grant, None

    def _holder(self, resource: str) -> Lock | None:
        """Who holds ``resource``'s lock, for ``lock.timeout`` (a plain read, which waits
        for no row lock); ``None`` if the database cannot say now."""
        try:
            with self._ctx.runtime.storage.transaction(readonly=True) as tx:
                return lock_get(tx, resource)
        except StorageError:
            return None

    def _lock_clock(self, now: float) -> float:
        """The clock a handle's ``held_until`` is read in: ``now`` (the app's clock) when
        it judges locks, else the monotonic clock standing in for the database's."""
        return time.monotonic() if self._ctx.runtime.leases_by_database else now

    def _take_back(self, handle: LockHandle, kept: LockHandle) -> bool:
        """``handle`` takes the lock ``kept`` let go of while its release waits for the
        commit of writes under it, if the row is still this attempt's (``kept``'s owner and
        fencing tokens); the release is ``handle``'s now. ``False``: another holder took
        it (or it was broken) meanwhile: ``kept``'s pending ``lock.released`` says
        ``lock.expired``, nothing of it is left to release, and ``handle`` is acquired as
        any lock is.

        Nothing is asked of the database while ``kept`` is surely held (``held_until``, the
        heartbeat renews it); past that the lock may have run out and been taken, and is
        renewed first (one statement, a compare-and-set on the owner token: a lock that ran
        out and that nobody took is still this attempt's, its fencing token unmoved).
        """
        runtime = self._ctx.runtime
        now = runtime.clock.now()
        sent = self._lock_clock(now)
        if not sent < kept.held_until:
            renew = LockRenew(
                kept.resource,
                kept.owner_token,
                now,
                handle.ttl,
                database_clock=runtime.leases_by_database,
                wait=row_wait(handle.wait),
            )
            try:
                with runtime.storage.transaction() as tx:
                    renewed = tx.lock_transition(renew)
            except RowLockTimeoutError as exc:
                raise row_held(kept.resource, "taken back", row_wait(handle.wait)) from exc
            if not renewed:
                assert kept.recorded is not None
                self._ctx.amend(kept.recorded, self._expired(kept.recorded, TAKEN))
                return False
            kept.held_until = sent + handle.ttl
        handle.held_until = kept.held_until
        handle.owner_token = kept.owner_token
        handle.fencing_token = kept.fencing_token
        handle.order = kept.order
        self.held[handle.resource] = handle
        self._ctx.record(
            "lock.acquired",
            resource=handle.resource,
            fencing_token=handle.fencing_token,
            owner_token=handle.owner_token,
            ttl=handle.ttl,
            wait=0.0,
            note="taken back before its release committed: still held by this attempt",
        )
        return True

    def _renewal_wait(self, handle: LockHandle) -> float:
        """How long the heartbeat's renewal of ``handle`` may wait for its row (``renew_all``)."""
        heartbeat = self._ctx.handler.contract.heartbeat
        return row_wait(min(handle.wait, heartbeat) if heartbeat > 0 else handle.wait)

    def renew_all(self) -> list[str]:
        """Extend every held lock by its TTL, and those whose release waits for a commit;
        returns the resources whose lock was lost.

        Each renewal waits for its lock's row at most the lock's ``wait``, and at most one
        heartbeat interval of the job's contract (the heartbeat renews them, and it beats
        every lease of its worker: a frozen commit holding a lock's row delays its next
        beat one interval at most): past it (PostgreSQL) ``RowLockTimeoutError`` naming the
        lock, that lock not renewed; the attempt's other locks are then renewed each in a
        transaction of its own (one stuck row rolled back the renewal of them all, and
        they ran out with it), and the heartbeat logs it, renews the other jobs' locks,
        and tries again at its next beat."""
        runtime = self._ctx.runtime
        lost = []
        now = runtime.clock.now()
        sent = self._lock_clock(now)  # before the renewal is sent: ``held_until``
        handles = sorted([*self.held.values(), *self.waiting.values()], key=acquisition_order)
        renewed = []
        handle = None
        try:
            with runtime.storage.transaction() as tx:
                for handle in handles:
                    if tx.lock_transition(self._renewal(handle, now)):
                        renewed.append(handle)
                    else:
                        lost.append(handle.resource)
                        handle.held_until = -math.inf
        except RowLockTimeoutError as exc:
            assert handle is not None
            stuck = row_held(handle.resource, "renewed", self._renewal_wait(handle))
            # That rolled back the renewal of every lock of the attempt: the others are
            # renewed each in a transaction of its own, so that they do not run out with
            # the stuck one (any other stuck one waits its own bound and stays as it is).
            for other in handles:
                if other is handle:
                    continue
                try:
                    with runtime.storage.transaction() as tx:
                        kept = tx.lock_transition(self._renewal(other, now))
                except RowLockTimeoutError:
                    continue
                if kept:
                    other.held_until = sent + other.ttl
                else:
                    other.held_until = -math.inf
            raise stuck from exc
        # Once committed: a renewal rolled back holds nothing longer.
        for handle in renewed:
            handle.held_until = sent + handle.ttl
        return lost

    def _renewal(self, handle: LockHandle, now: float) -> LockRenew:
        """The heartbeat's renewal of ``handle``'s lock, asked at ``now``."""
        return LockRenew(
            handle.resource,
            handle.owner_token,
            now,
            handle.ttl,
            database_clock=self._ctx.runtime.leases_by_database,
            wait=self._renewal_wait(handle),
        )


def _timeout(resource: str, holder: dict[str, Any], waited: float) -> LockTimeoutError:
    return LockTimeoutError(
        f"lock {resource!r} is held by worker {holder.get('holder') or '?'} (job "
        f"{holder.get('holder_job') or '?'}, fencing token {holder.get('holder_token') or '?'}); "
        f"waited {waited:.2f}s"
    )


def observed_holds(
    source: RuntimeSource, job_type: str, version: str, *, jobs: int = 1000
) -> list[LockHold]:
    """The lock holds recorded by the last ``jobs`` production jobs of ``job_type`` ``version``:
    each ``lock.acquired`` paired with its attempt's ``lock.released`` or ``lock.expired``.

    A hold whose release was never recorded (the process died) is not counted: its
    length is unknown.
    """
    runtime = source.runtime
    holds: list[LockHold] = []
    with runtime.storage.transaction(readonly=True) as tx:
        for job in tx.job_list(JobFilter(None, job_type, "production", jobs)):
            if job.handler_version != version:
                continue
            taken: dict[tuple[int | None, str | None], TraceEvent] = {}
            for event in tx.trace_query(TraceQuery(job_id=job.id)):
                key = (event.attempt, event.resource)
                if event.name == "lock.acquired" and event.data.get("ttl") is not None:
                    taken[key] = event
                elif event.name in ("lock.released", "lock.expired") and key in taken:
                    start = taken.pop(key)
                    holds.append(
                        LockHold(
                            str(event.resource),
                            float(start.data["ttl"]),
                            event.ts - start.ts,
                            expired=event.name == "lock.expired",
                        )
                    )
    return holds


def list_locks(source: RuntimeSource) -> list[LockInfo]:
    """Locks currently held (owner set), for ``replayq locks list``."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        return [_info(row) for row in tx.lock_list(LockFilter())]


def break_lock(
    source: RuntimeSource, resource: str, *, reason: str, wait: float = DEFAULT_WAIT_SECONDS
) -> LockInfo | None:
    """Force a lock free (the holder's later writes are fenced off); the reason is traced.

    Waits for the lock's row at most ``wait`` seconds (PostgreSQL: a commit writing under
    the lock holds it, and a worker frozen inside one holds it until it thaws or its
    session ends): past it ``RowLockTimeoutError`` (a ``DatabaseUnavailableError``; the
    command line's exit 3), nothing broken."""
    runtime = source.runtime
    if not reason.strip():
        raise ConfigurationError("breaking a lock needs a reason")
    if not wait > 0:
        raise ConfigurationError(f"breaking a lock: wait must be positive, got {wait!r}")
    now, hlc = runtime.clock.now(), runtime.hlc.tick()
    # The trace names the lock redacted, as a job's lock events do (``Recorder._event``).
    traced = runtime.redactor.resource(resource)
    try:
        with runtime.storage.transaction() as tx:
            row = tx.lock_transition(LockRelease(resource, None, hlc, wait=wait))
            if row is None:
                return None
            tx.trace_append(
                [
                    TraceEvent(
                        trace_id=f"admin:{traced}",
                        name="lock.broken",
                        ts=now,
                        hlc=hlc,
                        job_id=row.job_id,
                        kind="domain",
                        resource=traced,
                        resource_version=row.fencing_token,
                        data=runtime.redactor.value({"reason": reason, "holder": row.worker_id}),
                    )
                ]
            )
            return _info(row)
    except RowLockTimeoutError as exc:
        raise row_held(resource, "broken", wait) from exc
