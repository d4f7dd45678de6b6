"""The queue's verbs of the storage seam: jobs inserted, leased, moved and ended.

``Transaction`` (``protocol.py``) is composed of this and the other families' protocols;
``sql_transaction.SqlTransaction`` implements it over named queries, with the parameter
structs of ``params.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, overload

from replayq.model import Job
from replayq.storage.params import (
    JobChange,
    JobInsert,
    JobLease,
    JobMatch,
    JobQuery,
    JobReroute,
    JobsComplete,
    LeasesExtend,
)


class JobTransaction(Protocol):
    """The job verbs of a ``Transaction``, and ``pipelined``: the block that ends it."""

    def job_insert(self, params: JobInsert) -> tuple[int, bool]:
        """Insert a job with its ``job.enqueued`` pack (``lifecycle_packs.enqueued_event``); on a
        duplicate ``message_id`` return ``(existing_id, False)`` and write nothing. Many
        jobs: ``job_enqueue``."""
        ...

    def job_enqueue(self, params: Sequence[JobInsert]) -> list[tuple[int, bool]]:
        """``job_insert`` of ``params`` (one pair each, in order): each row inserted with
        its ``job.enqueued`` event (``lifecycle_packs.enqueued_event``) as its first trace pack; a
        duplicate ``message_id`` writes neither. One statement for all of it on
        PostgreSQL; on SQLite one insert per job, which keeps the pack in the job's row
        (``rq_jobs.enqueued``, migration 0023; read through the view ``rq_packs``)."""
        ...

    def job_get(self, job_id: int) -> Job | None: ...

    def job_lease(self, params: JobLease) -> list[Job]:
        """Claim up to ``limit`` ready jobs, honouring priority, ``run_at`` and per-key FIFO."""
        ...

    def lease_check(self, job_id: int, owner_token: str) -> bool:
        """Whether ``owner_token`` holds the job's lease, kept so until this transaction ends.

        The fence of every write a job makes: a step's commit, an effect's claim and
        result. ``False`` once the lease was reaped or re-leased; on PostgreSQL the
        row is locked (``FOR SHARE``) so a concurrent reaper cannot interleave.
        """
        ...

    def lease_extend(self, params: LeasesExtend) -> set[int]:
        """Extend every lease of ``params`` in one statement; the ids of those still held
        (each row a compare-and-set on its own owner token)."""
        ...

    def jobs_complete(self, params: JobsComplete) -> set[int]:
        """Mark succeeded, in one statement, each running job whose owner token still holds
        it (a compare-and-set per row); the ids of those it marked."""
        ...

    def jobs_complete_sent(self, params: JobsComplete) -> Callable[[], set[int]]:
        """``jobs_complete``, its answer (the ids marked) given by the function returned.
        In a ``pipelined`` block on PostgreSQL the statement is sent and not waited for:
        it travels with the next statement that waits (a group commit's lease), and the
        function reads its result then (or waits for it). Call it before the block ends:
        an ack refused must roll the transaction back, never commit."""
        ...

    def pipelined(self, *, refusals: bool = False) -> AbstractContextManager[None]:
        """The end of this transaction: the statements in the block, then its commit.

        On a pooled PostgreSQL transaction the block runs in psycopg's pipeline mode and
        commits at its end, the statements not yet waited for (``jobs_complete_sent``,
        the new trace packs of a ``trace_append`` that index no resource, what ``send``
        and ``send_many`` sent) sent with the next that waits or with the ``COMMIT``; an
        error in any of them fails the commit (``StorageError``) and nothing commits.
        Every other verb in the block waits for its own result, as outside it; nothing
        but replayq's verbs may run in it (``Recorder.defer``'s ``pipelines``). An
        exception in the block rolls the transaction
        back. Nothing may follow the block in the transaction. Elsewhere (SQLite, a
        caller's connection) it changes nothing: the transaction commits when it ends.

        ``refusals``: the block's compare-and-sets (an entity's head, an effect's claim and
        success), the fences of its writes under a lock (``LockFilter.newer_than``) and
        its fenced trace append are not waited for either: each refuses in the server
        when it changes no row, finds the lock's fencing token moved on or the lease
        gone, so the whole block is one round trip. They answer as if they had changed
        their row (``True``) or found the token where it was (no lock newer), and
        a refusal fails the block with ``CommitRefused`` (nothing committed): the caller
        runs it again without ``refusals`` (``commit_at_once``, ``storage/commits.py``),
        where each answer is read and says what happened. The block's last trace append
        must be its last statement of the trace (nothing joins its pack). Elsewhere it
        changes nothing."""
        ...

    @overload
    def job_transition(self, change: JobChange) -> bool: ...

    @overload
    def job_transition(self, change: JobReroute) -> int: ...

    def job_transition(self, change: JobChange | JobReroute) -> bool | int:
        """Apply one compare-and-set to a job row; ``False`` when its condition failed
        (the lease was lost, the job is not in the expected state). ``JobReroute`` moves
        many queued rows and answers how many."""
        ...

    def job_list(self, params: JobQuery) -> list[Job]:
        """Jobs matching a ``JobFilter``, newest (highest id) first, at most ``limit``; the
        running jobs of a worker asked to stop (``CancelRequested``); or those whose lease
        expired (``LeasesExpired``), which the caller re-queues."""
        ...

    def job_match(self, params: JobMatch) -> list[int]:
        """Ids of production jobs matching every filter of a bulk action, oldest first."""
        ...
