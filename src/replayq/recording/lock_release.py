"""Releasing a job attempt's locks: at once, after the commit of the writes under them,
or on their own once that commit will never come.

A lock let go of while writes carrying its fencing token wait for their commit is
released by that commit, in its transaction, after them (``release``, then
``_release_waiting``): until they land nobody takes the lock and reads what they are
about to change; the heartbeat renews it meanwhile (``LockManager.renew_all``) and the
attempt may take it back (``LockManager._take_back``). When the attempt is settled and
no commit of it is to come (``abandon``), the waiting releases are made each in a
transaction of its own. Every release is one compare-and-release on the owner token, its
``lock.released`` turned ``lock.expired`` when the lock ran out or was taken first.

``LockReleases`` is the release half of ``LockManager`` (``locks.py``), a mixin as the
storage's verbs are: it declares the state it shares with the acquisition half, and
knows a handle only as ``Releasable`` (as the views know the context only as
``Attempt``), so that nothing here imports ``locks.py`` back.

On PostgreSQL a release on its own (at once, or abandoned) waits for the lock's row at
most the lock's ``wait`` (``row_wait``): a commit writing under the lock holds the row
until it ends, a worker frozen inside one until it thaws or its session ends. Past it
``RowLockTimeoutError`` naming the lock (``row_held``), nothing released. A release a
step's commit makes after its writes is not bounded: that commit holds the row already.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Generic, Protocol, TypeVar

from replayq.errors import RowLockTimeoutError
from replayq.model import TraceEvent
from replayq.recording.attempt import Attempt
from replayq.recording.world import LIVE
from replayq.storage.commits import commit_at_once
from replayq.storage.context_params import LockRelease, LockReleaseInTime
from replayq.storage.protocol import TraceQuery, Transaction

log = logging.getLogger("replayq.locks")

# The note of a ``lock.expired`` whose lock another holder took (or an operator broke)
# before its holder let go of it.
TAKEN = "the lock expired or was broken before the holder finished"
# The least a statement writing a lock's row may wait for it (``row_wait``; an
# acquisition's try too, however little of its ``wait`` is left): a commit that fences a
# write under the lock holds the row for its duration, a few milliseconds.
ROW_WAIT_FLOOR = 0.05


class Releasable(Protocol):
    """What a release reads and writes of a lock's handle (``locks.LockHandle``)."""

    resource: str
    owner_token: str
    fencing_token: int | None
    # Its place among the attempt's acquisitions (``acquisition_order``).
    order: int
    # A release waiting for a commit: its ``lock.released`` as built, and as pending now.
    release_event: TraceEvent | None
    recorded: TraceEvent | None
    # How long its acquisition waits for the lock (``ctx.lock(wait=...)``): a release on
    # its own waits for the lock's row at most that (``row_wait``).
    wait: float


Handle = TypeVar("Handle", bound=Releasable)


class LockReleases(Generic[Handle]):
    """``LockManager``'s releases: at once, deferred to the next commit, or abandoned."""

    _ctx: Attempt
    held: dict[str, Handle]
    waiting: dict[str, Handle]
    # Of ``waiting``, those the commit running ``_release_waiting`` kept waiting; and the
    # ``lock.released`` of each a commit kept, which it committed: a release on its own
    # (``abandon``) does not append it again.
    kept: list[str]
    traced: list[TraceEvent]
    deferred: bool
    ended: bool

    def release(self, handle: Handle) -> None:
        """Let go of ``handle``'s lock: released at once, or, while writes under it wait for
        their commit, by that commit (after them, in its transaction): nobody takes the lock
        and reads what they are about to change before they land. Either way its
        ``lock.released`` (``lock.expired`` if it ran out or was broken first) commits with
        the release."""
        ctx = self._ctx
        if ctx._callback is not None:  # still held, the attempt's end lets go of it
            ctx._refuse_inside(f"ctx.lock({handle.resource!r}) release")
        self.held.pop(handle.resource, None)
        recorded = ctx.world.lock_outcome("release", handle.resource)
        if recorded is not LIVE:
            expired = recorded["event"] == "lock.expired"
            ctx.record(
                recorded["event"],
                status="fail" if expired else None,
                resource=handle.resource,
                fencing_token=handle.fencing_token or None,
                note=recorded.get("note"),
                replayed=True,
            )
            return
        hlc = ctx.runtime.hlc.tick()
        if (
            handle.fencing_token is not None
            and not self.ended
            and ctx.fenced_by(handle.resource, handle.fencing_token)
        ):
            event = ctx.record(
                "lock.released",
                resource=handle.resource,
                fencing_token=handle.fencing_token,
                hlc=hlc,
            )
            handle.release_event = handle.recorded = event
            if not self.deferred:
                ctx.defer_release(self._release_waiting)
                self.deferred = True
            self.waiting[handle.resource] = handle
            return
        event = ctx.event(
            "lock.released",
            resource=handle.resource,
            fencing_token=handle.fencing_token,
            hlc=hlc,
        )

        wait = row_wait(handle.wait)

        def block(tx: Transaction) -> None:
            tx.trace_append([self._release_in(tx, handle, event, wait)])

        try:
            commit_at_once(ctx.runtime.storage, block)
        except RowLockTimeoutError as exc:
            raise row_held(handle.resource, "released", wait) from exc

    def _release_waiting(self, tx: Transaction) -> None:
        """The releases waiting for this commit (``defer_release``), in the order their locks
        were acquired (their heartbeat's renewal takes the rows in that order too); each
        pending event amended to what its release found.

        Not a lock whose writes still wait in a step running in another thread or task
        (``Recorder._running``): this commit (another step's, the ack) does not write them,
        so the lock is kept until the commit that does (that step's), or ``abandon``."""
        ctx = self._ctx
        self.kept = []
        for handle in sorted(self.waiting.values(), key=acquisition_order):
            assert handle.release_event is not None and handle.recorded is not None
            if handle.fencing_token is not None and ctx._fenced_in_step(
                handle.resource, handle.fencing_token
            ):
                self.kept.append(handle.resource)
                continue
            event = self._release_in(tx, handle, handle.release_event)
            if event is not handle.recorded:
                ctx.amend(handle.recorded, event)
                handle.recorded = event

    def released(self) -> None:
        """The commit that ran the waiting releases committed (``Context.committed``): those
        it kept (``_release_waiting``) wait for the next commit."""
        kept = self.kept
        if not kept:
            self.waiting.clear()
            self.deferred = False
            return
        self.waiting = {r: h for r, h in self.waiting.items() if r in kept}
        self.traced += [h.release_event for h in self.waiting.values() if h.release_event]
        self.kept = []
        self._ctx.defer_release(self._release_waiting)

    def abandon(self) -> None:
        """The attempt is settled (``Context.release``) and no commit of it is to come: the releases
        still waiting for one are made now, each in a transaction of its own, and a lock
        let go of later (a thread of the handler's) is released at once.

        A release waits for the commit of the writes it guarded; when that commit never
        came (a group commit or a settle given up, a failure commit that failed, the
        writes refused every time), the writes did not land, and nothing is left to guard:
        the lock is freed rather than held until its TTL. One statement on the lock's owner
        token (``LockReleaseInTime``; ``LockRelease`` too if it ran out), so a lock another
        holder took since is never released; its pending ``lock.released`` (or
        ``lock.expired``) is appended with it, once: if the row is no longer this
        attempt's because that commit landed after all (its answer lost), it recorded the
        event itself, and nothing is appended. A failure here (the database away) leaves
        the lock to its TTL, as before, and is logged."""
        self.ended = True
        if not self.waiting:
            return
        waiting = sorted(self.waiting.values(), key=acquisition_order)
        self.waiting = {}
        self.deferred = False
        for handle in waiting:
            try:
                self._release_abandoned(handle)
            except Exception as exc:
                log.warning(
                    "job %s: lock %s, let go of while its writes waited for a commit that "
                    "never came, could not be released (%s); it runs out after its TTL",
                    self._ctx.job.id,
                    handle.resource,
                    exc,
                )

    def _release_abandoned(self, handle: Handle) -> None:
        """``handle``'s lock released on its own (``abandon``), with its event."""
        event = handle.release_event
        assert event is not None
        with self._ctx.runtime.storage.transaction() as tx:
            done = self._release_in(tx, handle, event, row_wait(handle.wait))
            if any(traced is event for traced in self.traced):
                return  # its event committed with the commit that kept it waiting
            if done is not event and done.data.get("note") == TAKEN and _traced(tx, event):
                return
            tx.trace_append([done])

    def _release_in(
        self, tx: Transaction, handle: Handle, event: TraceEvent, wait: float | None = None
    ) -> TraceEvent:
        """Release ``handle``'s lock in ``tx``; ``event`` (its ``lock.released``) as it is to
        be recorded: itself, or ``lock.expired`` (same place in the sequence) when the lock
        ran out while held, even if nobody took it meanwhile, or was taken or broken.

        One statement (``LockReleaseInTime``), judged in the clock that granted the lock
        (the database's, unless a test clock); on PostgreSQL sent unread in a commit in one
        round trip. Only a lock that ran out asks more (``LockRelease``). ``wait``: how long
        they may wait for the lock's row (a release on its own); ``None`` in a step's
        commit, which holds the row already (its fence) and waits for no one."""
        runtime = self._ctx.runtime
        if tx.lock_transition(
            LockReleaseInTime(
                handle.resource,
                handle.owner_token,
                runtime.clock.now(),
                event.hlc,
                runtime.leases_by_database,
                wait=wait,
            )
        ):
            return event
        released = tx.lock_transition(
            LockRelease(handle.resource, handle.owner_token, event.hlc, wait=wait)
        )
        note = (
            "the lock's lease ran out before the holder released it"
            if released is not None
            else TAKEN
        )
        return self._expired(event, note)

    def _expired(self, event: TraceEvent, note: str) -> TraceEvent:
        """``event`` (a ``lock.released``) as ``lock.expired``, its place kept."""
        return dataclasses.replace(
            event,
            name="lock.expired",
            status="fail",
            data=self._ctx.redactor.value({**event.data, "note": note}),
        )


def acquisition_order(handle: Releasable) -> int:
    """The order ``handle``'s lock was acquired in: locks are renewed and released in it."""
    return handle.order


def row_wait(wait: float) -> float:
    """How long a statement writing a lock's row may wait for it, for a lock whose ``wait``
    is ``wait``: that, and at least ``ROW_WAIT_FLOOR``."""
    return max(wait, ROW_WAIT_FLOOR)


def row_held(resource: str, done: str, wait: float) -> RowLockTimeoutError:
    """The error of a renewal, release or break of ``resource``'s lock whose statement
    waited for the lock's row past its bound (SQLSTATE 55P03): what was not done, and why."""
    return RowLockTimeoutError(
        f"lock {resource!r} not {done}: its row stayed locked by another transaction for "
        f"{wait:.2f}s (a commit writing under the lock, maybe of a worker frozen inside it: "
        f"SIGSTOP, a paused VM); nothing changed, try again later"
    )


def _traced(tx: Transaction, event: TraceEvent) -> bool:
    """Whether ``event``'s place (its attempt's sequence number) is in its trace already."""
    return any(
        stored.seq == event.seq and stored.attempt == event.attempt
        for stored in tx.trace_query(TraceQuery(trace_id=event.trace_id))
    )
